// `mmtrain eval CONFIG --load DIR`: the held-out loss of a model's weights without training
// (train/evaluate.h, the same keys, data and parallelism as the run of CONFIG). DIR is an mmtrain
// checkpoint, an HF model directory or a PyTorch DCP (convert/model_weights.h; a DCP is staged in
// <output_dir>/.eval_from_dcp_<random>/).
// Prints a table and writes the record as JSON (--out; default <output_dir>/eval_iter_<N>.json,
// never over an existing file). At a checkpoint of step N it equals the run's own evaluation after N.
#include "cli/command.h"
#include "cli/options.h"
#include "cli/tool_run.h"
#include "config/config.h"
#include "config/registries.h"
#include "convert/convert.h"
#include "convert/model_weights.h"
#include "core/error.h"
#include "core/scratch_dir.h"
#include "core/text.h"
#include "dist/runtime.h"
#include "io/user_file.h"
#include "train/build.h"
#include "train/evaluate.h"
#include "train/run.h"
#include "train/state.h"

#include <CLI/CLI.hpp>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace mmtrain {

namespace fs = std::filesystem;

namespace {

void print_record(const EvalRecord& record, const std::string& dir) {
  std::printf("\nheld-out evaluation of %s (iteration %lld)\n", printable(dir).c_str(),
              static_cast<long long>(record.iteration));
  const nlohmann::json j = record.to_json();
  for (const auto& [key, value] : j.items()) {
    if (key == "kind" || key == "iteration") continue;
    std::printf("  %-24s %s\n", key.c_str(), value.is_number_float() ? format("%.6f", value.get<double>()).c_str()
                                                                       : value.dump().c_str());
  }
}

// Where the record goes must be writable and free before any work is done: its directory is made
// (or refused: a file in the way), and an existing file there is never overwritten.
void check_out(const std::string& out) {
  const fs::path parent = fs::path(out).parent_path();
  std::error_code error;
  if (!parent.empty()) fs::create_directories(parent, error);
  if (error || (!parent.empty() && !fs::is_directory(parent)))
    fail("eval --out ", out, ": its directory ", parent.string(), " cannot be made (", error ? error.message() : "not a directory", ")");
  if (fs::symlink_status(out, error).type() != fs::file_type::not_found)
    fail("eval --out ", out, ": exists; an earlier result is never overwritten: remove it or choose another --out");
}

// Written whole to a temporary file, then linked to its name (link() never replaces a file: one
// that appeared meanwhile is not overwritten); a failed write leaves nothing at out.
void write_record(const EvalRecord& record, const std::string& out, const std::string& dir, bool ema) {
  nlohmann::json j = record.to_json();
  j["load"] = dir;
  j["weights"] = ema ? "ema" : "model";  // --ema: the checkpoint's EMA weights
  const std::string tmp = out + ".tmp-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());  // a stale one of an earlier process with this pid; a link there is removed, not followed
  try {
    write_file_no_follow(tmp, j.dump(2) + "\n", "eval --out " + out);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  const int linked = ::link(tmp.c_str(), out.c_str());
  const int err = errno;
  ::unlink(tmp.c_str());
  if (linked != 0)
    fail("eval --out ", out, ": cannot create it (", std::strerror(err),
         err == EEXIST ? "; an earlier result is never overwritten: remove it or choose another --out" : "", ")");
  std::printf("wrote %s\n", out.c_str());
}

}  // namespace

void add_eval_commands(CLI::App& app, Commands& commands) {
  struct Options {
    std::string config_path, load, out;
    ConfigOverrides overrides;
    bool ema = false;
  };
  auto o = std::make_shared<Options>();
  auto* eval = app.add_subcommand("eval", "the held-out loss of a checkpoint, an HF model directory or a DCP, "
                                          "without training (launch with torchrun for N ranks)");
  eval->add_option("config", o->config_path, "YAML config of the run (its validation set and parallelism)")->required();
  eval->add_option("--load", o->load, "mmtrain checkpoint (iter_N or save root), HF model directory, or DCP")
      ->required();
  eval->add_flag("--ema", o->ema, "evaluate the checkpoint's EMA weights (training.ema) instead of its weights");
  eval->add_option("--out", o->out, "JSON result (default <output_dir>/eval_iter_<N>.json; never overwritten)");
  o->overrides.add_options(eval, "training.eval_iters=4");
  commands.add(eval, [o] {
    Config config = load_tool_config(o->config_path, o->overrides.resolved(), "", "eval");
    if (config.training.objective == "grpo")
      fail("eval: config ", config.source_path, ": training.objective grpo has no held-out evaluation yet (the rewards "
           "of held-out prompts are not measured; docs/grpo.md): evaluate with `mmtrain sample mistral3` and your reward");
    if (config.data.validation.empty() && config.data.validation_split == 0.0)
      fail("eval: config ", config.source_path, " names no validation set: set data.validation (a data set section) ",
           "or data.validation_split");
    // Nothing trains: with a validation set of its own, the training set is not read at all (the
    // run's data pipeline is built over the validation set instead; the timestep keys stay the
    // training section's, which validation_data carries over).
    if (!config.data.validation.empty()) {
      const nlohmann::json validation = config.data.validation;
      config.data = config.data.validation_data();
      config.data.validation = validation;
    }
    Run run;
    start_tool_run(run, std::move(config));
    // A named --out is checked before anything is built or read; the default one's name needs
    // the iteration, so it is checked once the weights are loaded, still before the evaluation.
    auto refuse_bad_out = [&](const std::string& out) {
      std::string refused;
      if (run.is_rank0()) {
        try {
          check_out(out);
        } catch (const Error& e) {
          refused = e.what();
        }
      }
      if (run.comm().any_rank(!refused.empty())) fail(run.is_rank0() ? refused : "eval --out " + out + ": refused by rank 0");
    };
    if (!o->out.empty()) refuse_bad_out(o->out);
    build_run(run);
    const int64_t iteration = load_tool_weights(run, o->load, "eval --load", ".eval_from_dcp_", o->ema);
    const std::string out = !o->out.empty() ? o->out
                                            : run.config.logging.output_dir + (o->ema ? "/eval_ema_" : "/eval_") +
                                                  checkpoint_dir_name(iteration) +
                                                  ".json";
    if (o->out.empty()) refuse_bad_out(out);
    Evaluator evaluator(run, false);
    const EvalRecord record = evaluator.evaluate(run, iteration);
    if (!run.is_rank0()) return;
    print_record(record, o->load);
    write_record(record, out, o->load, o->ema);
  });
}

}  // namespace mmtrain
