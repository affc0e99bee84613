// `mmtrain convert MODEL dcp-to-ckpt | ckpt-to-dcp`: PyTorch Distributed Checkpoints in and out.
// PyTorch's own DCP reader and writer do the DCP side (the project's Python module
// mmtrain_py.dcp.bridge, cli/python_runner.h), through one flat safetensors file beside the output; this file maps its keys to
// the model's parameters, AdamW moments and run state, and writes (or reads) the mmtrain checkpoint.
#include "convert/conversion_output.h"
#include "convert/convert.h"

#include "checkpoint/sharded_checkpoint.h"
#include "cli/python_runner.h"
#include "config/config.h"
#include "core/error.h"
#include "core/finite.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "models/model_spec.h"
#include "optim/lr_schedule.h"
#include "train/state.h"

#include <fnmatch.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kOptimizerPrefixes[] = {"optim.state.", "optimizer.state."};
constexpr const char* kParamGroupPrefixes[] = {"optim.param_groups.", "optimizer.param_groups."};

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// Runs the bridge ("list", "read" or "write", then its paths); on failure, fails with what it printed.
// The paths go absolute: none starts with '-', which the bridge would read as a flag.
void run_bridge(const std::string& verb, const std::string& from, const std::string& to, const std::string& what,
                const std::vector<std::string>& more = {}) {
  std::vector<std::string> args = {verb, fs::absolute(from).string(), fs::absolute(to).string()};
  for (const auto& path : more) args.push_back(fs::absolute(path).string());
  run_python_module("dcp.bridge", args, to + ".bridge.log", what);
}

// The temporary flat file beside `out` (removed when this goes out of scope).
struct FlatFile {
  std::string path;
  explicit FlatFile(const std::string& out) : path(fs::path(out).lexically_normal().string() + ".dcp_flat.safetensors") {
    if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path());
  }
  ~FlatFile() {
    std::error_code ignored;
    fs::remove(path, ignored);
  }
};

bool dropped(const std::string& key, const std::vector<std::string>& patterns) {
  for (const auto& pattern : patterns)
    if (::fnmatch(pattern.c_str(), key.c_str(), 0) == 0) return true;
  return false;
}

// What a DCP key holds for this model.
struct Placement {
  enum Kind { weight, moment, step, unknown } kind = unknown;
  std::string param;  // the model's parameter name
  std::string field;  // a moment's: "exp_avg" or "exp_avg_sq"
};

// A DCP names a parameter by the model's own name or by its HF key (the names a PyTorch port of
// the model uses, MindSpeed-MM's among them), either with a "model." prefix or without.
using ParamOfFqn = std::map<std::string, std::string>;

ParamOfFqn param_of_fqn(Model& model, const HfAdapter& adapter) {
  ParamOfFqn out;
  for (const auto& [name, param] : model.named_parameters()) {
    out[name] = name;
    out[adapter.hf_key(name)] = name;
    for (const auto& alias : adapter.hf_key_aliases(name)) out[alias] = name;
  }
  return out;
}

std::optional<std::string> param_named(const std::string& fqn, const ParamOfFqn& params) {
  for (const std::string& candidate : {fqn, starts_with(fqn, "model.") ? fqn.substr(6) : std::string()})
    if (const auto found = params.find(candidate); !candidate.empty() && found != params.end()) return found->second;
  return std::nullopt;
}

Placement place(const std::string& key, const ParamOfFqn& params) {
  if (const auto param = param_named(key, params)) return {Placement::weight, *param, ""};
  for (const char* prefix : kOptimizerPrefixes) {
    if (!starts_with(key, prefix)) continue;
    const std::string rest = key.substr(std::string(prefix).size());
    for (const char* field : {"exp_avg_sq", "exp_avg", "step"}) {
      const std::string suffix = std::string(".") + field;
      if (rest.size() > suffix.size() && rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) == 0) {
        const auto param = param_named(rest.substr(0, rest.size() - suffix.size()), params);
        if (!param) return {};
        if (std::string(field) == "step") return {Placement::step, *param, ""};
        return {Placement::moment, *param, field};
      }
    }
  }
  return {};
}

// A hyperparameter in the DCP's param groups must be the run's (a resumed run uses the config's).
void check_hyperparameter(const std::string& key, const nlohmann::json& value, const TrainingConfig& t,
                          const std::string& config_path) {
  const std::string name = key.substr(key.rfind('.') + 1);
  auto differs = [&](double dcp_value, double config_value, const char* config_key) {
    if (dcp_value != config_value)
      fail("dcp-to-ckpt: '", key, "' is ", dcp_value, " but ", config_path, " sets training.", config_key, " ",
           config_value, " (the run would step with different hyperparameters)");
  };
  if (name == "betas" && value.is_array() && value.size() == 2 && value[0].is_number() && value[1].is_number()) {
    differs(value[0].get<double>(), t.adam_beta1, "adam_beta1");
    differs(value[1].get<double>(), t.adam_beta2, "adam_beta2");
  } else if (name == "eps" && value.is_number()) {
    differs(value.get<double>(), t.adam_eps, "adam_eps");
  } else if (name == "weight_decay" && value.is_number()) {
    differs(value.get<double>(), t.weight_decay, "weight_decay");
  } else if ((name == "amsgrad" || name == "maximize") && value.is_boolean() && value.get<bool>()) {
    fail("dcp-to-ckpt: '", key, "' is true: mmtrain's AdamW has no ", name);
  }
}

// The ranks that wrote a DCP directory: its data files are named __<rank>_<n>.distcp.
int dcp_writer_ranks(const std::string& dcp_dir) {
  std::set<int> ranks;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dcp_dir, error)) {
    int rank = 0, n = 0;
    char tail[16] = {};
    if (std::sscanf(entry.path().filename().c_str(), "__%d_%d%15s", &rank, &n, tail) == 3 && std::string(tail) == ".distcp")
      ranks.insert(rank);
  }
  return std::max<int>(1, static_cast<int>(ranks.size()));
}

// What dcp-to-ckpt does, for the run of `config`; weights_only (HF export of a DCP): the
// optimizer, train_state and lr_scheduler entries are left out and a model-only checkpoint written.
std::string dcp_to_checkpoint(const Config& config, const std::string& load_dir, const std::string& save_dir,
                              std::vector<std::string> drop_patterns, int world_size, bool weights_only,
                              DcpLayout layout, const std::string& shown_root) {
  const std::string& model_id = config.model.model_id;
  const std::string& config_path = config.source_path;
  const auto& spec = model_spec(model_id, "convert");
  if (world_size < 0) fail("dcp-to-ckpt: --world-size must be at least 1 (0: the ranks that wrote the DCP), found ", world_size);
  if (world_size == 0) world_size = dcp_writer_ranks(load_dir);
  if (weights_only)
    for (const char* pattern : {"optim.*", "optimizer.*", "train_state.*", "lr_scheduler.*"}) drop_patterns.push_back(pattern);
  auto model = spec.build(config.model.config);
  const auto adapter = make_hf_adapter(spec, config.model.config);
  std::map<std::string, Param*> params;
  for (auto& [name, param] : model->named_parameters()) params[name] = param;
  const auto names = param_of_fqn(*model, *adapter);

  FlatFile flat_file(save_dir);
  // What the DCP holds, from its metadata alone: every key is placed, dropped by a pattern, or
  // listed as unknown (and the conversion refused) before any of its data is read.
  const std::string listing_path = flat_file.path + ".keys.json";
  struct RemoveListing {
    std::string path;
    ~RemoveListing() {
      std::error_code ignored;
      fs::remove(path, ignored);
    }
  } remove_listing{listing_path};
  fs::remove(listing_path);  // an interrupted conversion's
  run_bridge("list", load_dir, listing_path, "dcp-to-ckpt: reading " + load_dir);
  const auto listing = json_parse_checked(file_read_text(listing_path), "dcp-to-ckpt: the listing of " + load_dir);
  std::map<std::string, std::string> weight_key;                        // param -> key
  std::map<std::string, std::map<std::string, std::string>> moment_key;  // param -> moment -> key
  std::vector<std::string> step_keys;                                   // the moments' step counters
  std::optional<std::string> iteration_key;                             // torchtitan's train_state.step tensor
  std::vector<std::string> unknown, dropped_keys;
  nlohmann::json wanted = nlohmann::json::array();
  for (const auto& [key, entry] : listing.at("tensors").items()) {
    if (dropped(key, drop_patterns)) {
      if (!weights_only) dropped_keys.push_back(key);
      continue;
    }
    const auto shape = entry.at("shape").get<std::vector<int64_t>>();
    if (key == "train_state.step" && shape.empty()) {  // torchtitan keeps it as a tensor
      iteration_key = key;
      wanted.push_back(key);
      continue;
    }
    const auto placement = place(key, names);
    switch (placement.kind) {
      case Placement::weight:
      case Placement::moment:
        if (shape != params.at(placement.param)->shape)
          fail("dcp-to-ckpt: '", key, "' has shape ", shape_str(shape), ", the model's '", placement.param,
               "' is ", shape_str(params.at(placement.param)->shape));
        if (placement.kind == Placement::weight)
          weight_key[placement.param] = key;
        else
          moment_key[placement.param][placement.field] = key;
        wanted.push_back(key);
        break;
      case Placement::step:
        step_keys.push_back(key);
        wanted.push_back(key);
        break;
      case Placement::unknown:
        unknown.push_back(key);
    }
  }
  for (const auto& key : listing.at("objects").get<std::vector<std::string>>()) {
    if (dropped(key, drop_patterns)) {
      if (!weights_only) dropped_keys.push_back(key);
    } else if (key == "train_state.step" || starts_with(key, kParamGroupPrefixes[0]) ||
               starts_with(key, kParamGroupPrefixes[1]) || starts_with(key, "lr_scheduler.")) {
      wanted.push_back(key);  // lr_scheduler: read and ignored (mmtrain's schedule is a function of the iteration)
    } else {
      unknown.push_back(key);
    }
  }
  if (!unknown.empty()) {
    std::string listed;
    for (size_t i = 0; i < unknown.size() && i < 20; ++i) listed += "\n  " + unknown[i];
    fail("dcp-to-ckpt: ", load_dir, " holds ", unknown.size(), " key(s) model '", model_id,
         "' cannot place (nothing written):", listed, unknown.size() > 20 ? "\n  ..." : "",
         "\npass --drop PATTERN (shell-style, repeatable) to leave keys out on purpose");
  }
  // Only the placed keys are read.
  const std::string wanted_path = flat_file.path + ".wanted.json";
  RemoveListing remove_wanted{wanted_path};
  file_write_atomic(wanted_path, wanted.dump());
  run_bridge("read", load_dir, flat_file.path, "dcp-to-ckpt: reading " + load_dir, {wanted_path});
  SafetensorsFile flat(flat_file.path);
  const auto meta = flat.metadata().find("dcp_objects");
  const auto objects = json_parse_checked(meta == flat.metadata().end() ? std::string("{}") : meta->second,
                                          "dcp-to-ckpt: the objects of " + load_dir);
  std::optional<int64_t> iteration;
  if (iteration_key) iteration = flat.read(*iteration_key).to(at::kLong).item<int64_t>();
  std::optional<double> optimizer_step;
  for (const auto& key : step_keys) {
    const double step = flat.read(key).to(at::kDouble).item<double>();
    if (optimizer_step && *optimizer_step != step)
      fail("dcp-to-ckpt: '", key, "' is step ", step, ", other parameters' are at step ", *optimizer_step);
    optimizer_step = step;
  }
  for (const auto& [key, value] : objects.items()) {
    if (key == "train_state.step" && value.is_number_integer())
      iteration = value.get<int64_t>();
    else if (starts_with(key, kParamGroupPrefixes[0]) || starts_with(key, kParamGroupPrefixes[1]))
      check_hyperparameter(key, value, config.training, config_path);
  }
  for (const auto& [name, param] : params)
    if (param->trainable && !weight_key.count(name))
      fail("dcp-to-ckpt: ", load_dir, " has no weight for '", name, "' (looked for 'model.", name, "' and '", name, "')");
  const bool with_optimizer = !moment_key.empty() || optimizer_step;
  if (with_optimizer)
    for (const auto& [name, param] : params)
      for (const char* moment : {"exp_avg", "exp_avg_sq"})
        if (param->trainable && param->requires_grad && !moment_key[name].count(moment))
          fail("dcp-to-ckpt: ", load_dir, " has optimizer state but no '", moment, "' for '", name,
               "' (looked for 'optim.state.", name, ".", moment, "')");
  if (!iteration && optimizer_step) iteration = static_cast<int64_t>(*optimizer_step);
  // The model's own layout conversions (the adapter's: e.g. gated-MLP rows de-interleaved for
  // training, as MindSpeed-MM's DCP holds them too): as many as the config expects.
  int64_t converted_layout = 0;
  for (const auto& [name, key] : weight_key) converted_layout += adapter->layout_differs(name) ? 1 : 0;
  if (converted_layout != adapter->expected_layout_conversions())
    fail("dcp-to-ckpt: ", load_dir, " holds ", converted_layout, " tensors in the model's converted layout, the config "
         "expects ", adapter->expected_layout_conversions());
  // --layout hf: the DCP holds the HF rows (a PyTorch port that loads the HF checkpoint as it is);
  // the adapter reorders them into the training layout, moments alike (elementwise state follows
  // its parameter's rows).
  auto training_rows = [&](const std::string& name, const std::string& key) {
    if (layout == DcpLayout::training || !adapter->layout_differs(name)) return flat.read(key);
    return adapter->load_rows(name, 0, params.at(name)->shape.at(0),
                              [&](const std::string&, int64_t b, int64_t e) { return flat.read_rows(key, b, e); });
  };

  StateInfo info;
  info.iteration = with_optimizer ? iteration.value_or(0) : 0;
  info.global_batch_size =
      config_global_batch(config, parallel_dims(config.parallel, world_size, "dcp-to-ckpt: " + config_path + ": "));
  info.model_id = model_id;
  info.config = config_to_json(config);
  info.extra = {{"source", load_dir}};
  info.plan = state_plan_entry(FsdpConfig{});  // one rank's whole tensors in fp32: any world size reshards them
  info.plan["converted_from"] = "dcp";
  const int64_t step = static_cast<int64_t>(optimizer_step.value_or(static_cast<double>(info.iteration)));

  // Written tensor by tensor, each read from the flat file when the checkpoint writer needs it:
  // memory holds one tensor at a time, however large the checkpoint.
  auto from_dcp = [&training_rows](const std::string& name, const std::string& key) {
    return [&training_rows, name, key] {
      at::Tensor value = training_rows(name, key).to(at::kFloat);
      if (const int64_t at = first_non_finite(value); at >= 0)
        fail("dcp-to-ckpt: '", key, "' holds ", value.reshape(-1)[at].item<double>(), " at element ", at,
             "; refusing to write non-finite state");
      return value;
    };
  };
  std::vector<ShardedTensor> tensors;
  for (const auto& [name, param] : params) {
    if (!param->trainable && !weight_key.count(name)) {
      tensors.push_back({state_model_key(name), param->shape, 0, param->init_value(), nullptr});  // a buffer
      continue;
    }
    tensors.push_back({state_model_key(name), param->shape, 0, at::Tensor(), from_dcp(name, weight_key.at(name))});
    if (!with_optimizer || !param->trainable) continue;
    for (const char* moment : {"exp_avg", "exp_avg_sq"}) {
      const std::string key = std::string(moment) == "exp_avg" ? state_exp_avg_key(name) : state_exp_avg_sq_key(name);
      auto zeros = [shape = param->shape] { return at::zeros(shape, at::kFloat); };  // a frozen param's
      tensors.push_back({key, param->shape, 0, at::Tensor(),
                         moment_key[name].count(moment) ? std::function<at::Tensor()>(from_dcp(name, moment_key[name][moment]))
                                                        : std::function<at::Tensor()>(zeros)});
    }
  }
  Comm comm(nullptr, 0, 1);
  const auto dir = checkpoint_save(save_dir, info.iteration, comm, tensors,
                                   state_global_state(info, with_optimizer ? std::optional<int64_t>(step) : std::nullopt),
                                   state_rank_state(), info.plan);
  std::printf("dcp-to-ckpt: %s -> %s (%zu weights, %lld in the converted layout%s, iteration %lld%s)\n",
              load_dir.c_str(), (fs::path(shown_root) / fs::path(dir).filename()).c_str(), weight_key.size(), static_cast<long long>(converted_layout),
              with_optimizer ? ", AdamW moments and step" : ", model only", static_cast<long long>(info.iteration),
              dropped_keys.empty() ? "" : (", dropped " + std::to_string(dropped_keys.size()) + " key(s)").c_str());
  for (const auto& key : dropped_keys) std::printf("dcp-to-ckpt: dropped '%s' (--drop)\n", key.c_str());
  return dir;
}

}  // namespace

bool is_dcp_dir(const std::string& dir) { return fs::is_regular_file(fs::path(dir) / ".metadata"); }

void convert_dcp_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& load_dir,
                         const std::string& save_dir, const std::vector<std::string>& drop_patterns, int world_size,
                         DcpLayout layout, bool overwrite) {
  auto config = config_load(config_path);
  if (config.model.model_id != model_id)
    fail("convert ", model_id, " dcp-to-ckpt: ", config_path, " configures model '", config.model.model_id, "'");
  ConversionOutput output(save_dir, overwrite, "dcp-to-ckpt");
  dcp_to_checkpoint(config, load_dir, output.staging(), drop_patterns, world_size, false, layout, save_dir);
  output.commit();
}

std::string convert_dcp_weights_to_ckpt(const std::string& model_id, const nlohmann::json& model_config,
                                        const std::string& load_dir, const std::string& save_dir) {
  Config config;
  config.source_path = "(the model's config)";
  config.model.model_id = model_id;
  config.model.config = model_config;
  return dcp_to_checkpoint(config, load_dir, save_dir, {}, 1, true, DcpLayout::training, save_dir);
}

void convert_ckpt_to_dcp(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                         DcpLayout layout, bool overwrite) {
  ConversionOutput output(save_dir, overwrite, "ckpt-to-dcp");
  const auto opened = open_checkpoint_of(model_id, load_dir, "ckpt-to-dcp");
  const CheckpointReader& reader = *opened.reader;
  const auto& model = opened.model;
  const auto& adapter = opened.adapter;
  const auto& global = reader.global_state();
  const bool with_optimizer = !global.value("model_only", false);
  const int64_t iteration = global.value("iteration", int64_t{0});
  if (with_optimizer && global.value("optimizer_state", std::string("adamw")) == "adamw8bit")
    fail("ckpt-to-dcp: ", reader.dir(), " holds the 8-bit AdamW's state (training.optimizer adamw8bit), which ",
         "torch.optim.AdamW does not take; `mmtrain convert ", model_id, " ckpt-to-bnb` writes it for bitsandbytes' ",
         "AdamW8bit (docs/optimizer.md)");

  // Each tensor is read from the checkpoint only when the flat file's writer reaches it.
  std::vector<SafetensorsSource> tensors;
  auto from_checkpoint = [&](const std::string& flat_key, const std::string& name, const std::string& key) {
    const bool to_hf = layout == DcpLayout::hf && adapter->layout_differs(name);
    tensors.push_back({flat_key, reader.dtype(key), reader.global_shape(key), [&reader, &adapter, to_hf, name, key] {
                         return to_hf ? adapter->to_hf_layout(name, reader.read_full(key)) : reader.read_full(key);
                       }});
  };
  nlohmann::json param_names = nlohmann::json::array();
  const double step = static_cast<double>(global.value("optimizer_step", iteration));
  for (auto& [name, param] : model->named_parameters()) {
    const std::string fqn = layout == DcpLayout::hf ? adapter->hf_key(name) : name;  // the port's parameter name
    from_checkpoint("model." + fqn, name, state_model_key(name));
    const std::string moment = state_exp_avg_key(name);
    if (!with_optimizer || !reader.contains(moment)) continue;
    param_names.push_back(fqn);
    from_checkpoint("optim.state." + fqn + ".exp_avg", name, moment);
    from_checkpoint("optim.state." + fqn + ".exp_avg_sq", name, state_exp_avg_sq_key(name));
    // torch.optim.AdamW(fused=True) keeps its step as a 0-dim fp32 tensor.
    tensors.push_back({"optim.state." + fqn + ".step", at::kFloat, {}, [step] { return at::full({}, step, at::kFloat); }});
  }
  nlohmann::json objects = {{"train_state.step", iteration}};
  if (with_optimizer) {
    const auto& t = global.at("config").at("training");
    const auto schedule = LrSchedule::make(t.at("lr"), t.at("lr_min"), t.at("lr_warmup_ratio"), t.at("train_iters"),
                                           t.at("lr_decay_style"));
    objects["optim.param_groups.0.lr"] = schedule.at(std::max<int64_t>(0, iteration - 1));
    objects["optim.param_groups.0.betas"] = {t.at("adam_beta1"), t.at("adam_beta2")};
    objects["optim.param_groups.0.eps"] = t.at("adam_eps");
    objects["optim.param_groups.0.weight_decay"] = t.at("weight_decay");
    objects["optim.param_groups.0.fused"] = true;
    objects["optim.param_groups.0.params"] = param_names;
  }
  const std::string dcp_dir = (fs::path(output.staging()) / "dcp").string();
  {
    FlatFile flat_file(dcp_dir);
    safetensors_write_streamed(flat_file.path, tensors, {{"format", "pt"}, {"dcp_objects", objects.dump()}});
    run_bridge("write", flat_file.path, dcp_dir, "ckpt-to-dcp: writing " + save_dir);
  }
  // The bridge writes its flat file and log beside the DCP directory: a sub-directory keeps them
  // inside the staging directory; the DCP's own files are what it commits (.metadata last).
  for (const auto& entry : fs::directory_iterator(dcp_dir))
    fs::rename(entry.path(), fs::path(output.staging()) / entry.path().filename());
  fs::remove(dcp_dir);
  output.commit();
  std::printf("ckpt-to-dcp: %s -> %s (%zu parameters%s, iteration %lld)\n", reader.dir().c_str(), save_dir.c_str(),
              model->named_parameters().size(), with_optimizer ? ", AdamW moments and step" : ", model only",
              static_cast<long long>(iteration));
}

}  // namespace mmtrain
