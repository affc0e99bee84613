// `mmtrain train CONFIG [--set key=value ...]`: one training run (under torchrun for several ranks).
#include "core/error.h"
#include "dist/failure_report.h"
#include "dist/runtime.h"
#include "nn/attention_amx.h"
#include "tools/command.h"
#include "train/trainer.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <memory>

namespace mmtrain {

void add_train_commands(CLI::App& app, Commands& commands) {
  struct Options {
    std::string config_path;
    std::vector<std::string> overrides;
    std::string set_file;
  };
  auto o = std::make_shared<Options>();
  auto* train = app.add_subcommand("train", "train a model from a YAML config (launch with torchrun for N ranks)");
  train->add_option("config", o->config_path, "YAML config file")->required();
  train->add_option("--set", o->overrides, "override a config key: --set training.lr=3e-4 (repeatable)");
  train->add_option("--set-file,--set_file", o->set_file,
                    "overrides from a file, one key=value per line (plan --auto --out writes one); --set wins");
  commands.add(train, [o] {
    auto overrides = o->set_file.empty() ? std::vector<std::string>{} : read_set_file(o->set_file);
    overrides.insert(overrides.end(), o->overrides.begin(), o->overrides.end());
    auto config = config_load(o->config_path, overrides);
    amx_attention_enabled();  // a bad MMTRAIN_CPU_ATTENTION fails here, before anything is built
    auto runtime = runtime_init(LaunchEnv::from_environment(), default_device(),
                                std::chrono::seconds(config.parallel.timeout_s));
    const auto peer_watch = runtime.peer_watch;
    try {
      Trainer trainer(std::move(config), std::move(runtime));
      trainer.run();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      // A collective failed because a peer went away (Gloo's own exceptions, or c10d's): say which.
      const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
      const std::string message = c10_error ? c10_error->what_without_backtrace() : e.what();
      if (!peer_watch || !is_peer_failure(message)) throw;
      fail(peer_watch->describe_silent_ranks(), "; this rank's collective failed with: ", message);
    }
  });
}

}  // namespace mmtrain
