#include "train/training_sampler.h"

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "io/user_file.h"
#include "record/device_memory.h"
#include "record/metrics.h"
#include "train/run.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace mmtrain {

namespace fs = std::filesystem;

Registry<TrainingSamplerFactory>& training_sampler_registry() {
  static Registry<TrainingSamplerFactory> registry("training sampler");
  return registry;
}

namespace {

fs::path samples_root(const Run& run) { return fs::path(run.config.logging.output_dir) / "samples"; }

// Rank 0 runs `check`; its error (if any) fails every rank. Collective.
void on_rank0_or_fail_all(Run& run, const std::function<std::string()>& check) {
  std::string problem;
  if (run.is_rank0()) {
    try {
      problem = check();
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  if (run.comm().any_rank(!problem.empty())) fail(run.is_rank0() ? problem : "refused by rank 0 (see its error)");
}

}  // namespace

SamplingPhase::SamplingPhase(Run& run) {
  const auto& t = run.config.training;
  if (t.sample_interval == 0 && !t.sample_at_start) return;
  if (!training_sampler_registry().contains(run.config.model.model_id))
    fail("training.sample_interval: model '", run.config.model.model_id, "' has no sampler");
  sampler_ = training_sampler_registry().get(run.config.model.model_id)(run);
  interval_ = t.sample_interval;
  at_start_ = t.sample_at_start;
  on_rank0_or_fail_all(run, [&]() -> std::string {
    const auto root = samples_root(run);
    if (const auto what = not_a_directory(root.string()); !what.empty())
      return "training samples: " + root.string() + " is " + what + "; the samples go into a directory of that name";
    return "";
  });
}

bool SamplingPhase::due(int64_t iteration) const {
  if (!sampler_) return false;
  return iteration == 0 ? at_start_ : interval_ > 0 && iteration % interval_ == 0;
}

bool SamplingPhase::run_if_due(Run& run, MetricsLog& metrics, int64_t iteration) {
  if (!due(iteration)) return true;
  const fs::path root = samples_root(run);
  const fs::path dir = root / checkpoint_dir_name(iteration);
  const fs::path partial = root / ("." + checkpoint_dir_name(iteration) + ".partial");
  std::error_code error;
  const bool exists = fs::symlink_status(dir, error).type() != fs::file_type::not_found;
  if (run.comm().any_rank(exists)) {
    run.log("samples of iteration " + std::to_string(iteration) + " exist in " + dir.string() + ": kept, not redone");
    return true;
  }
  const auto began = std::chrono::steady_clock::now();
  std::string failed;
  auto attempt = [&](const std::function<void()>& work) {
    if (!failed.empty()) return;
    try {
      work();
    } catch (const std::exception& e) {
      failed = e.what();
    }
  };
  // Rank 0 makes the partial directory (a killed run's is removed first); every rank learns whether it could.
  if (run.is_rank0())
    attempt([&] {
      if (const auto what = not_a_directory(root.string()); !what.empty()) fail(root.string(), " is ", what);
      fs::create_directory(root);
      fs::remove_all(partial);
      if (!fs::create_directory(partial)) fail("cannot create ", partial.string());
    });
  bool any_failed = run.comm().any_rank(!failed.empty());
  SampleRecord record;
  if (!any_failed) {
    reset_device_memory_peak(run.comm().device());
    attempt([&] { record = sampler_->sample(run, partial.string()); });
    any_failed = run.comm().any_rank(!failed.empty());
  }
  if (!any_failed && run.is_rank0()) attempt([&] { fs::rename(partial, dir); });
  any_failed = run.comm().any_rank(!failed.empty());
  if (any_failed) {
    if (run.is_rank0()) fs::remove_all(partial, error);
    record = SampleRecord{};  // what a sampler made before a later step failed is not shown
    record.error = failed.empty() ? "failed on another rank (see its error)" : failed;
    run.log("warning: the samples after iteration " + std::to_string(iteration) + " failed: " + record.error +
            (run.config.training.sample_failure == "stop" ? "" : " (training goes on: training.sample_failure)"));
  } else if (const auto peak = device_memory_peak(run.comm().device())) {
    record.peak_device_allocated_mb = run.comm().all_reduce_max(std::vector<double>{peak->allocated_mb})[0];
  }
  record.iteration = iteration;
  record.dir = dir.string();
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  metrics.record(record);
  return !any_failed;
}

}  // namespace mmtrain
