// `mmtrain train CONFIG [--set key=value ...]`: one training run (under torchrun for several ranks).
#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "dist/failure_report.h"
#include "dist/runtime.h"
#include "nn/attention_amx.h"
#include "train/trainer.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <memory>

namespace mmtrain {

void add_train_commands(CLI::App& app, Commands& commands) {
  struct Options {
    std::string config_path;
    ConfigOverrides overrides;
  };
  auto o = std::make_shared<Options>();
  auto* train = app.add_subcommand("train", "train a model from a YAML config (launch with torchrun for N ranks)");
  train->add_option("config", o->config_path, "YAML config file")->required();
  o->overrides.add_options(train, "training.lr=3e-4");
  commands.add(train, [o] {
    auto config = config_load(o->config_path, o->overrides.resolved());
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
