// `mmtrain debug collate`: the trainer's data path (build_data) for one micro-batch, written to
// safetensors with where it came from in the metadata.
// `mmtrain debug step`: the trainer's model path (build_model, the parallelize chain on one rank,
// the initial weights, then training.load's when set, forward_backward) for one forward + backward.
#include "debugging/debug.h"

#include "cli/command.h"
#include "core/error.h"
#include "core/text.h"
#include "debugging/debug_image.h"
#include "debugging/debug_optimizer.h"
#include "debugging/tokenize.h"
#include "io/safetensors.h"
#include "train/build.h"
#include "train/preference_reference.h"
#include "train/state.h"
#include "train/train_step.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>

namespace mmtrain {

void debug_collate(const std::string& config_path, const std::vector<std::string>& overrides,
                   const std::string& out_path, const DebugCollateOptions& o) {
  auto c = config_load(config_path, overrides);
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    fail("debug collate: expected 0 <= --rank < --world, found rank ", o.rank, ", world ", o.world);
  const ParallelDims dims = config_resolve_world(c, o.world);
  if (o.step < 0) fail("debug collate: --step must be >= 0, found ", o.step);
  const auto data = build_data(c, dims.mesh().dp_rank_of(o.rank), dims.dp());
  const int64_t micro_batches = data.sampler.micro_batches(o.step);  // per step under a token budget
  if (o.micro < 0 || o.micro >= micro_batches)
    fail("debug collate: --micro must be in 0..", micro_batches - 1, " (step ", o.step, "'s micro-batches per rank: ",
         data.sampler.token_budget() ? "data.dataloader_param.micro_batch_tokens" : "training.gradient_accumulation_steps",
         "), found ", o.micro);
  const auto batch = data.micro_batch(o.step, o.micro);

  std::vector<std::pair<std::string, at::Tensor>> tensors(batch.begin(), batch.end());  // std::map: sorted
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  safetensors_write(out_path, tensors,
                    {{"step", std::to_string(o.step)},
                     {"micro", std::to_string(o.micro)},
                     {"rank", std::to_string(o.rank)},
                     {"world", std::to_string(o.world)},
                     {"seed", std::to_string(c.training.seed)},
                     {"sample_indices", join_ints(data.sampler.indices(o.step, o.micro))}});
}

namespace {

// The parameter whose row layout name's rows follow: a lora_B's rows are its Linear's output rows
// (a weight whose HF rows are laid out otherwise has its lora_B's reordered the same way); a
// lora_A's rows are the rank, in no layout.
std::string hf_layout_name(const std::string& name) {
  const std::string lora_b = ".lora_B.weight";
  if (name.ends_with(lora_b)) return name.substr(0, name.size() - lora_b.size()) + ".weight";
  return name;
}

}  // namespace

void debug_step(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& batch_path, const std::string& out_path) {
  auto config = config_load(config_path, overrides);
  config_resolve_world(config, 1);  // one process, like the trainer at world size 1
  config_check_supported(config, 1);
  check_objective(config);
  auto model = build_model(config);
  const auto mesh = DeviceMesh::single(std::make_shared<Comm>(nullptr, 0, 1));
  auto fsdp = parallelize_model(config, *model, mesh);
  load_initial_weights(config, *model, *fsdp);
  const auto reference = build_preference_reference(config, mesh);
  if (!config.training.load.empty()) {  // a checkpoint's weights over them (a LoRA run's: its adapters)
    StateLoadOptions options;
    options.model_id = config.model.model_id;
    options.model_config = config.model.config;
    options.execution_only_keys = config_model_spec(config).execution_only_keys;
    options.lora_base = lora_base(config);
    state_load_weights(config.training.load, *model, *fsdp, options);
  }
  const auto adapter = make_hf_adapter(config_model_spec(config), config.model.config);

  SafetensorsFile batch_file(batch_path);
  Batch batch;
  for (const auto& name : batch_file.names()) batch[name] = batch_file.read(name);
  const auto out = forward_backward(*model, *fsdp, batch, 1.0, {}, objective_forward(config, reference));

  std::vector<std::pair<std::string, at::Tensor>> tensors = {{"loss", out.loss.detach().to(at::kFloat)}};
  if (const auto metrics = objective_metrics(out.metrics); metrics.is_object())  // a preference objective's
    for (const auto& [name, value] : metrics.items())
      tensors.emplace_back("metric." + name, at::tensor(value.get<double>(), at::kFloat));
  for (const auto& [name, t] : out.tensors) tensors.emplace_back(name, t.detach().to(at::kFloat).contiguous());
  for (auto* unit : fsdp->units())
    for (auto& p : unit->params) {
      if (p.frozen) continue;  // no grad by construction
      auto grad = p.view_of(unit->grad_flat).narrow(0, 0, p.layout.dim0);
      tensors.emplace_back("grad." + adapter->hf_key(p.name), adapter->to_hf_layout(hf_layout_name(p.name), grad).contiguous());
    }
  safetensors_write(out_path, tensors);
}

void add_debug_commands(CLI::App& app, Commands& commands) {
  auto* debug = app.add_subcommand("debug", "inspect one stage of the pipeline");
  debug->require_subcommand(1);

  struct CollateArgs {
    std::string config_path, out_path;
    std::vector<std::string> overrides;
    DebugCollateOptions options;
  };
  auto c = std::make_shared<CollateArgs>();
  auto* collate = debug->add_subcommand("collate", "write one collated micro-batch of a config as safetensors");
  collate->add_option("config", c->config_path, "YAML config file")->required();
  collate->add_option("--out", c->out_path, "output .safetensors file")->required();
  collate->add_option("--step", c->options.step, "0-based optimizer step")->capture_default_str();
  collate->add_option("--micro", c->options.micro, "micro-batch within the step")->capture_default_str();
  collate->add_option("--rank", c->options.rank, "data-parallel rank")->capture_default_str();
  collate->add_option("--world", c->options.world, "data-parallel world size")->capture_default_str();
  collate->add_option("--set", c->overrides, "override a config key (repeatable)");
  commands.add(collate, [c] {
    debug_collate(c->config_path, c->overrides, c->out_path, c->options);
    std::printf("wrote %s\n", c->out_path.c_str());
  });

  struct StepArgs {
    std::string config_path, batch_path, out_path;
    std::vector<std::string> overrides;
  };
  auto s = std::make_shared<StepArgs>();
  auto* step = debug->add_subcommand("step", "one forward + backward on a batch; writes loss, outputs and HF-layout grads");
  step->add_option("config", s->config_path, "YAML config")->required();
  step->add_option("--set", s->overrides, "override a config key (repeatable)");
  step->add_option("--batch", s->batch_path, "batch as safetensors (the collator's keys)")->required();
  step->add_option("--out", s->out_path, "output .safetensors")->required();
  commands.add(step, [s] { debug_step(s->config_path, s->overrides, s->batch_path, s->out_path); });

  // Hidden (empty group): the tokenizer parity tests' entry point.
  auto t = std::make_shared<DebugTokenizeOptions>();
  auto* tokenize = debug->add_subcommand("tokenize", "tokenize a JSONL of strings (parity tests)")->group("");
  tokenize->add_option("--tokenizer", t->tokenizer_path, "tekken.json or tokenizer.json")->required();
  tokenize->add_option("--format", t->format, "tekken | hf | auto")
      ->check(CLI::IsMember({"tekken", "hf", "auto"}))
      ->capture_default_str();
  tokenize->add_flag("--fix-mistral-regex", t->fix_mistral_regex, "hf: transformers' fix_mistral_regex");
  tokenize->add_flag("--split-special-tokens", t->split_special_tokens, "hf: no added special tokens from text");
  tokenize->add_option("--in", t->in_path, "JSONL, one JSON string per line")->required();
  tokenize->add_option("--out", t->out_path, "JSONL, one {ids, text} per line")->required();
  commands.add(tokenize, [t] { debug_tokenize(*t); });

  // Hidden (group ""): the 8-bit AdamW on given grads, for the bitsandbytes parity test.
  auto opt = std::make_shared<DebugOptimizerOptions>();
  auto* optimizer = debug->add_subcommand("optimizer-steps", "8-bit AdamW steps on given params and grads "
                                          "(debugging/debug_optimizer.h)")->group("");
  optimizer->add_option("--tensors", opt->tensors_path, "safetensors: param.<name>, grad.<k>.<name>")->required();
  optimizer->add_option("--save", opt->save_dir, "checkpoint root: one iter_<k> per step")->required();
  optimizer->add_option("--steps", opt->steps, "steps")->capture_default_str();
  optimizer->add_option("--lr", opt->lr, "learning rate")->capture_default_str();
  optimizer->add_option("--beta1", opt->beta1, "Adam beta1")->capture_default_str();
  optimizer->add_option("--beta2", opt->beta2, "Adam beta2")->capture_default_str();
  optimizer->add_option("--eps", opt->eps, "Adam eps")->capture_default_str();
  optimizer->add_option("--weight_decay", opt->weight_decay, "decoupled weight decay")->capture_default_str();
  optimizer->add_option("--min_8bit_size", opt->min_8bit_size, "params below it keep fp32 moments")->capture_default_str();
  commands.add(optimizer, [opt] { debug_optimizer_steps(*opt); });

  // Hidden (group ""): the Pixtral image pipeline on one file, for the parity tests.
  struct ImageArgs {
    std::string in_path, out_path;
    DebugImageOptions options;
  };
  auto i = std::make_shared<ImageArgs>();
  auto* image = debug->add_subcommand("image", "Pixtral image pipeline on one image (debugging/debug_image.h)")->group("");
  image->add_option("--in", i->in_path, "image file (PNG, JPEG, ...)")->required();
  image->add_option("--out", i->out_path, "output .safetensors")->required();
  image->add_flag("--align-to-patch", i->options.align_to_patch, "multiples of patch_size (LLaMA-Factory), not patch*merge");
  image->add_flag("--with-decoded", i->options.with_decoded, "also write the decoded RGB image");
  commands.add(image, [i] { debug_image(i->in_path, i->out_path, i->options); });
}

}  // namespace mmtrain
