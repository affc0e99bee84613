// mmtrain: the command-line entry point. Subcommands:
//   train CONFIG [--set key=value ...]   train (under torchrun for several ranks)
//   fixture tokens --out FILE ...         synthetic token data for tests and the demo
//   plan CONFIG --world-size N [--seqlen L]   per-rank memory without allocating (docs/tools.md)
//   logs parse FILE | logs compare A B      training logs (metrics.jsonl or Megatron lines) as JSON / compared
//   flops magihuman (--config CFG | --ckpt DIR) --seqlens ...   model FLOPs, TFLOP/s, MFU (docs/flops.md)
#include "core/config.h"
#include "core/error.h"
#include "dist/runtime.h"
#include "tools/builtins.h"
#include "tools/fixture.h"
#include "tools/flops.h"
#include "tools/logs.h"
#include "tools/plan.h"
#include "train/trainer.h"

#include <CLI/CLI.hpp>

#include <cstdio>

namespace mmtrain {
void register_test_models();
}

int main(int argc, char** argv) {
  using namespace mmtrain;
  CLI::App app{"mmtrain: FSDP2 training for large multimodal models"};
  app.require_subcommand(1);

  auto* train = app.add_subcommand("train", "train a model from a YAML config (launch with torchrun for N ranks)");
  std::string config_path;
  std::vector<std::string> overrides;
  train->add_option("config", config_path, "YAML config file")->required();
  train->add_option("--set", overrides, "override a config key: --set training.lr=3e-4 (repeatable)");

  auto* fixture = app.add_subcommand("fixture", "generate synthetic data / weights");
  fixture->require_subcommand(1);
  auto* tokens = fixture->add_subcommand("tokens", "token data: safetensors `tokens` int64 [samples, seq_len]");
  std::string out_path;
  int64_t samples = 256, seq_len = 65, vocab = 128;
  uint64_t seed = 0;
  tokens->add_option("--out", out_path, "output .safetensors file")->required();
  tokens->add_option("--samples", samples, "number of samples")->capture_default_str();
  tokens->add_option("--seq-len", seq_len, "tokens per sample (the model sees seq_len - 1)")->capture_default_str();
  tokens->add_option("--vocab", vocab, "vocabulary size")->capture_default_str();
  tokens->add_option("--seed", seed, "random seed")->capture_default_str();
  bool learnable = false;
  tokens->add_flag("--learnable", learnable, "noisy affine sequences a model can learn (default: uniform noise)");

  auto* flops = app.add_subcommand("flops", "model FLOPs, TFLOP/s per device and MFU (docs/flops.md)");
  flops->require_subcommand(1);
  auto* flops_mh = flops->add_subcommand("magihuman", "MagiHuman, in the seed's flops_magihuman.py convention");
  FlopsOptions flops_options;
  auto* flops_config = flops_mh->add_option("--config", flops_options.config_path, "mmtrain YAML (model.config)");
  auto* flops_ckpt = flops_mh->add_option("--ckpt", flops_options.ckpt_dir, "HF checkpoint dir (shapes from headers)");
  flops_config->excludes(flops_ckpt);
  flops_mh->add_option("--set", flops_options.overrides, "override a key of --config (repeatable)");
  flops_mh->add_option("--seqlens", flops_options.seqlens, "per-sample sequence lengths")->required();
  flops_mh->add_option("--gbs", flops_options.global_batch_size, "global batch size (samples per step)")
      ->capture_default_str();
  flops_mh->add_option("--device_num,--device-num", flops_options.device_num, "devices")->capture_default_str();
  flops_mh->add_option("--step_time,--step-time", flops_options.step_time, "seconds per step (0: no throughput)")
      ->capture_default_str();
  flops_mh->add_option("--hardware_flops,--hardware-flops", flops_options.hardware_flops,
                       "peak FLOP/s per device (0: no MFU)")
      ->capture_default_str();
  flops_mh->add_option("--attention-coefficient,--attention_coefficient", flops_options.attention_coefficient,
                       "FLOPs per s^2*head_dim*heads*layer: the seed's 7; full bidirectional attention is ~2x")
      ->capture_default_str();

  auto* plan = app.add_subcommand("plan", "per-rank memory of a run, from shapes only (docs/tools.md)");
  PlanOptions plan_options;
  plan->add_option("config", plan_options.config_path, "YAML config file")->required();
  plan->add_option("--world-size,--world_size", plan_options.world_size, "ranks")->capture_default_str();
  plan->add_option("--seqlen", plan_options.seqlen, "tokens per sample (default: the model's)");
  plan->add_option("--set", plan_options.overrides, "override a config key (repeatable)");

  auto* logs = app.add_subcommand("logs", "training logs: metrics.jsonl or Megatron-style console lines (docs/tools.md)");
  logs->require_subcommand(1);
  auto* logs_parse_cmd = logs->add_subcommand("parse", "print one normalized JSON record per iteration");
  std::string log_a, log_b;
  logs_parse_cmd->add_option("file", log_a, "log file")->required();
  auto* logs_compare_cmd = logs->add_subcommand("compare", "loss agreement, step time and throughput of two runs");
  logs_compare_cmd->add_option("a", log_a, "log of run A")->required();
  logs_compare_cmd->add_option("b", log_b, "log of run B (the reference)")->required();
  LogStatsOptions log_stats;
  logs_compare_cmd->add_option("--skip-first,--skip_first", log_stats.skip_first, "warm-up iterations left out of step times")
      ->capture_default_str();
  logs_compare_cmd->add_option("--window", log_stats.window, "also average the last W iterations (0: off)")
      ->capture_default_str();

  CLI11_PARSE(app, argc, argv);
  try {
    register_builtins();
    register_test_models();
    if (train->parsed()) {
      auto config = config_load(config_path, overrides);
      auto runtime = runtime_init(LaunchEnv::from_environment(), Device::cpu);
      Trainer trainer(std::move(config), std::move(runtime));
      trainer.run();
    } else if (tokens->parsed()) {
      fixture_tokens(out_path, samples, seq_len, vocab, seed, learnable);
      std::printf("wrote %s\n", out_path.c_str());
    } else if (logs_parse_cmd->parsed()) {
      logs_parse(log_a);
    } else if (logs_compare_cmd->parsed()) {
      logs_compare(log_a, log_b, log_stats);
    } else if (plan->parsed()) {
      plan_memory(plan_options);
    } else if (flops_mh->parsed()) {
      flops_magihuman(flops_options);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "mmtrain: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mmtrain: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
