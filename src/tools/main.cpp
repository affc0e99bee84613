// mmtrain: the command-line entry point. Subcommands:
//   train CONFIG [--set key=value ...]   train (under torchrun for several ranks)
//   fixture tokens --out FILE ...         synthetic token data for tests and the demo
#include "core/config.h"
#include "core/error.h"
#include "dist/runtime.h"
#include "tools/builtins.h"
#include "tools/fixture.h"
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
