// `mmtrain sample mistral3 CONFIG --load DIR --prompts FILE.jsonl --out DIR`: Magistral's answers to
// prompts in the training data's own format, generated with a key/value cache
// (sample/token_generation.h), greedy or with temperature and top-p, FSDP-sharded over the ranks
// with the prompts split over the data-parallel ranks. docs/sampling.md.
#include "cli/options.h"
#include "cli/tool_run.h"
#include "config/config.h"
#include "convert/model_weights.h"
#include "core/cli_command.h"
#include "core/error.h"
#include "dist/runtime.h"
#include "sample/mistral3_prompts.h"
#include "train/run.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <memory>

namespace mmtrain {

namespace {

struct Options {
  std::string config_path, load, prompts, out, image_dir;
  int64_t max_new_tokens = 256;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  bool no_kv_cache = false, save_logits = false, ema = false, no_image_tokens = false;
  ConfigOverrides overrides;
};

void run_sample(const Options& o) {
  Config config = load_tool_config(o.config_path, o.overrides.resolved(), "mistral3", "sample mistral3");
  sample::refuse_context_parallel_generation(config, "sample mistral3");
  sample::TokenSampling sampling;
  sampling.max_new_tokens = o.max_new_tokens;
  sampling.temperature = o.temperature;
  sampling.top_p = o.top_p;
  sampling.kv_cache = !o.no_kv_cache;
  if (o.max_new_tokens < 1 || o.max_new_tokens > 65536) fail("--max-new-tokens must be in 1..65536, found ", o.max_new_tokens);
  if (!(o.temperature >= 0 && std::isfinite(o.temperature))) fail("--temperature must be >= 0, found ", o.temperature);
  if (!(o.top_p > 0 && o.top_p <= 1)) fail("--top-p must be in (0, 1], found ", o.top_p);

  const auto prompts = sample::read_mistral3_prompts(config, o.prompts, o.image_dir);
  if (o.no_image_tokens) sampling.suppressed = sample::image_token_ids(config, *prompts.tokenizer);

  Run run;
  start_tool_run(run, std::move(config));
  make_new_output_dir(run, o.out, "--out");
  build_tool_model(run);
  load_tool_weights(run, o.load, "sample --load", ".sample_from_dcp_", o.ema);
  sample::generate_completions(run, prompts, sampling, o.seed, o.save_logits, o.out);
}

const CliRegistration sample_command(
    sample_registry(), "mistral3",
    {"Magistral's answers to conversations (greedy or top-p, KV cache)",
     [](CLI::App& command) {
       auto* cmd = &command;
       auto o = std::make_shared<Options>();
       cmd->add_option("config", o->config_path, "YAML config of the model (model, data template and images, parallelism)")
           ->required();
       cmd->add_option("--load", o->load, "mmtrain checkpoint, HF model directory or DCP")->required();
       cmd->add_flag("--ema", o->ema, "sample with the checkpoint's EMA weights (training.ema)");
       cmd->add_option("--prompts", o->prompts, "JSONL of records in the training data's format; a final assistant "
                       "message is dropped")->required();
       cmd->add_option("--out", o->out, "output directory (new): completions.jsonl")->required();
       cmd->add_option("--image-dir", o->image_dir, "root of relative image paths (default the config's dataset_dir)");
       cmd->add_option("--max-new-tokens", o->max_new_tokens, "stop after this many tokens (or at </s>)")
           ->capture_default_str();
       cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
       cmd->add_option("--top-p", o->top_p, "with --temperature > 0: nucleus sampling")->capture_default_str();
       cmd->add_option("--seed", o->seed, "prompt i samples with seed + i")->capture_default_str();
       cmd->add_flag("--no-kv-cache", o->no_kv_cache, "recompute the whole prefix for every token (the reference path)");
       cmd->add_flag("--no-image-tokens", o->no_image_tokens,
                     "never generate Magistral's image tokens (as GRPO's rollouts generate)");
       cmd->add_flag("--save-logits", o->save_logits, "also write logits_<i>.safetensors: each generated token's logits");
       o->overrides.add_options(cmd, "parallel.fsdp_plan.cpu_offload=true");
       return [o] { run_sample(*o); };
     }});


}  // namespace

}  // namespace mmtrain
