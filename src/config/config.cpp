// The run config (contract in config.h): the seven sections mounted on one schema, the world-size
// checks (the degrees themselves are parallel/parallel_dims.h's), and the one list of seed keys mmtrain reads but does not implement.
#include "config/config.h"

#include "core/config_schema.h"
#include "core/error.h"
#include "core/regular_file.h"
#include "core/suggest.h"
#include "io/user_file.h"
#include "data/dataset.h"
#include "models/model_spec.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace mmtrain {
namespace {

void declare_config(ConfigSection<Config>& root) {
  root.section("parallel", &Config::parallel, ParallelConfig::declare)
      .section("model", &Config::model, ModelConfig::declare)
      .section("data", &Config::data, DataConfig::declare)
      .section("features", &Config::features, FeaturesConfig::declare)
      .section("training", &Config::training, TrainingConfig::declare)
      .section("logging", &Config::logging, LoggingConfig::declare)
      .section("tools", &Config::tools, ToolsConfig::declare);
}

const ConfigSchema& schema() {
  static const ConfigSchema instance = [] {
    ConfigSchema s;
    auto root = s.root<Config>();
    declare_config(root);
    return s;
  }();
  return instance;
}

// Seed keys mmtrain reads but does not implement. Each must keep the value a default Config
// holds, or `train` refuses the run naming the key: accepting a key and ignoring it would be a
// silent lie. docs/config.md marks the same keys.
struct Unimplemented {
  const char* path;
  const char* needs;
};
const Unimplemented kUnimplemented[] = {
    {"parallel.tensor_parallel_size", "tensor parallelism"},
    {"parallel.expert_parallel_size", "expert parallelism"},
    {"parallel.expert_fully_shard_parallel_size", "expert FSDP (expert parallelism)"},
    {"parallel.fsdp_plan.ignored_modules", "unsharded modules"},
    {"model.enable_gradient_checkpointing", "model-internal checkpointing (features.recompute does this)"},
    {"features.loss_cfg.loss_type", "a loss reduction other than the model's own ('raw')"},
    {"features.recompute_plan.use_reentrant",
     "non-reentrant recompute (mmtrain's recompute is the reentrant form; the gradients are the same)"},
    {"training.adam_fused", "ATen's fused AdamW kernel"},
    {"tools.profile.with_stack",
     "Python stack frames in the trace (mmtrain has none: its phase, FSDP-unit and op scopes nest instead)"},
};

// A seed plugin path ("mindspeed_mm/fsdp/models/<model>/<model>_fsdp2") is there to register a
// model or dataset; mmtrain has them built in, so each entry must name one of those.
void check_plugins(const Config& c) {
  std::vector<std::string> known = model_spec_registry().names();
  for (const auto& name : dataset_registry().names()) known.push_back(name);
  for (size_t i = 0; i < c.training.plugin.size(); ++i) {
    const auto& entry = c.training.plugin[i];
    const std::string last = std::filesystem::path(entry).filename().string();
    bool found = false;
    for (const auto& name : known) found = found || last.rfind(name, 0) == 0;
    if (!found)
      fail("config ", c.source_path, ": training.plugin[", i, "]: '", entry,
           "' names no model or dataset built into mmtrain (plugins only register them; mmtrain has ",
           join_names(known), ")");
  }
}

}  // namespace

Config config_from_yaml_string(const std::string& text, const std::string& source_name,
                               const std::vector<std::string>& overrides) {
  Config config;
  config.source_path = source_name;
  schema().load(&config, text, source_name, overrides);
  return config;
}

Config config_load(const std::string& path, const std::vector<std::string>& overrides) {
  require_regular_file(path, "config " + path, "a YAML file");
  return config_from_yaml_string(read_user_file(path, "config " + path, kMaxConfigFileBytes), path, overrides);
}

nlohmann::json config_to_json(const Config& config) { return schema().to_json(&config); }

ParallelDims config_check_world(const Config& c, int world_size) {
  const ParallelDims dims = parallel_dims(c.parallel, world_size, "config " + c.source_path + ": ");
  config_accumulation(c, dims);
  return dims;
}

bool config_needs_reference_copy(const Config& config) {
  const auto& t = config.training;
  return (t.objective == "dpo" || (t.objective == "grpo" && t.grpo.beta != 0.0)) && !config.features.enable_lora;
}

int config_accumulation(const Config& c, const ParallelDims& dims) {
  const std::string where = "config " + c.source_path + ": ";
  const auto& t = c.training;
  const int64_t per_micro = int64_t{t.micro_batch_size} * dims.dp();  // samples per micro-batch, all ranks
  if (t.global_batch_size == 0) return t.gradient_accumulation_steps == 0 ? 1 : t.gradient_accumulation_steps;
  if (t.global_batch_size % per_micro != 0)
    fail(where, "training.global_batch_size ", t.global_batch_size, " is not a multiple of micro_batch_size * ",
         "data-parallel size = ", t.micro_batch_size, " * ", dims.dp(), " = ", per_micro, " on this world of ",
         dims.world, " ranks: no whole number of accumulation steps keeps it");
  const int64_t derived = t.global_batch_size / per_micro;
  if (t.gradient_accumulation_steps != 0 && t.gradient_accumulation_steps != derived)
    fail(where, "training.gradient_accumulation_steps ", t.gradient_accumulation_steps,
         " disagrees with training.global_batch_size ", t.global_batch_size, " = micro_batch_size * ",
         "gradient_accumulation_steps * data-parallel size = ", t.micro_batch_size, " * ", derived, " * ", dims.dp(),
         " on this world: set one of them (gradient_accumulation_steps 0 derives it)");
  return static_cast<int>(derived);
}

int64_t config_global_batch(const Config& c, const ParallelDims& dims) {
  return int64_t{c.training.micro_batch_size} * config_accumulation(c, dims) * dims.dp();
}

ParallelDims config_resolve_world(Config& c, int world_size) {
  const ParallelDims dims = parallel_dims(c.parallel, world_size, "config " + c.source_path + ": ");
  c.training.gradient_accumulation_steps = config_accumulation(c, dims);
  return dims;
}

ParallelDims config_check_supported(const Config& c, int world_size) {
  const ParallelDims dims = config_check_world(c, world_size);
  const std::string where = "config " + c.source_path + ": ";
  const Config defaults;
  for (const auto& key : kUnimplemented) {
    const auto value = schema().value(&c, key.path), fallback = schema().value(&defaults, key.path);
    if (value != fallback)
      fail(where, key.path, ": ", value.dump(), " needs ", key.needs, ", which mmtrain does not implement yet; ",
           "use the default (", fallback.dump(), ")");
  }
  const auto& t = c.training;
  const bool ema_on_disk = t.ema.enable && t.ema.offload == "disk";
  if (!t.offload_dir.empty() && t.optimizer == "adamw" && !c.parallel.fsdp_plan.cpu_offload && !ema_on_disk)
    fail(where, "training.offload_dir: expected empty unless training.optimizer is adamw_swap or adamw8bit, "
         "parallel.fsdp_plan.cpu_offload is true or training.ema.offload is disk (it holds their state on disk), "
         "found '", t.offload_dir, "' with none of them");
  if (ema_on_disk && t.offload_dir.empty())
    fail(where, "training.ema.offload disk: set training.offload_dir, the directory of the disk tier's files");
  if (!t.ema.enable && t.ema.offload != defaults.training.ema.offload)
    fail(where, "training.ema.offload: ", t.ema.offload, " set while training.ema.enable is false; remove it or enable ",
         "the EMA");
  if (t.optimizer != "adamw8bit" && t.min_8bit_size != defaults.training.min_8bit_size)
    fail(where, "training.min_8bit_size: ", t.min_8bit_size, " applies to training.optimizer adamw8bit only, and the "
         "optimizer is ", t.optimizer, "; remove it or set the optimizer");
  config_check_token_budget(c);
  if ((t.eval_interval > 0 || t.eval_at_start) && c.data.validation.empty() && c.data.validation_split == 0.0)
    fail(where, "training.eval_interval ", t.eval_interval, t.eval_at_start ? " with eval_at_start" : "",
         " needs a validation set: set data.validation (a data set section) or data.validation_split (a fraction "
         "held out of the training set)");
  check_plugins(c);
  return dims;
}

void config_check_token_budget(const Config& c) {
  const auto& loader = c.data.loader;
  if (loader.micro_batch_tokens > 0 && c.training.micro_batch_size != 1)
    fail("config ", c.source_path, ": data.dataloader_param.micro_batch_tokens ", loader.micro_batch_tokens,
         " and training.micro_batch_size ", c.training.micro_batch_size, " both size the micro-batches: with a token "
         "budget leave micro_batch_size at 1 and give the samples per step as training.global_batch_size");
}

}  // namespace mmtrain
