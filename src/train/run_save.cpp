#include "train/run_save.h"

#include "core/error.h"
#include "core/text.h"
#include "io/user_file.h"
#include "train/build.h"
#include "train/state.h"

#include <chrono>
#include <optional>

namespace mmtrain {

void lock_save_root(Run& run) {
  const auto& save = run.config.training.save;
  if (save.empty()) return;
  std::string refused;
  if (run.is_rank0()) {
    try {
      run.save_lock = std::make_unique<SaveRootLock>(save);
    } catch (const Error& e) {
      refused = e.what();
    }
  }
  if (run.comm().any_rank(!refused.empty())) {
    if (!run.is_rank0()) fail("rank 0 could not lock training.save '", save, "': see its error");
    fail(refused);
  }
  if (run.save_lock && !run.save_lock->previous_holder().empty())
    run.log("training.save: took over the lock of an earlier run that is gone (" + run.save_lock->previous_holder() + ")");
}

namespace {

// training.keep_best: <save>/best.json from the list `latest`'s checkpoint holds. keep_latest_k's
// pruning rewrites it before it removes anything; without pruning, it is rewritten here.
void write_best_index(const Run& run) {
  try {
    best_checkpoints_sync_index(run.config.training.save);
  } catch (const std::exception& e) {
    run.log(std::string("warning: training.keep_best: ") + e.what() + " (the checkpoint is saved)");
  }
}

// What a completed save prints: its directory, then the ones keep_latest_k removed, and as
// warnings what it could not remove (the checkpoint is committed all the same).
void finish_save(const Run& run, const std::string& dir, const CheckpointPruned& pruned) {
  if (!dir.empty()) run.log("saved checkpoint " + dir);
  const auto& t = run.config.training;
  if (!dir.empty() && run.is_rank0() && t.keep_best > 0 && t.keep_latest_k == 0) write_best_index(run);
  const std::string what = "training.keep_latest_k " + std::to_string(run.config.training.keep_latest_k);
  for (const auto& name : pruned.removed) run.log(what + ": removed " + name);
  for (const auto& warning : pruned.warnings) run.log("warning: " + what + ": " + warning + " (the checkpoint is saved)");
}

void finish_async_save(const Run& run, const std::optional<AsyncCheckpointSaver::Completed>& done) {
  if (done) finish_save(run, done->dir, done->pruned);
}

}  // namespace

void save_checkpoint(Run& run, int64_t step, const std::function<void(double stall_ms)>& record_step) {
  const auto began = std::chrono::steady_clock::now();
  auto stalled_so_far = [&] {
    record_step(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count());
  };
  const Config& config = run.config;
  StateInfo info;
  info.iteration = step;
  info.global_batch_size = run.data.sampler.global_batch_size();
  info.model_id = config.model.model_id;
  info.config = config_to_json(config);
  info.plan = state_plan_entry(config.parallel.fsdp_plan);
  info.extra["lineage"] = run.lineage;
  if (const auto held_out = held_out_draw(run.config, *run.data.dataset); !held_out.is_null()) info.extra["held_out"] = held_out;
  info.lora_base = run.lora_base;
  info.preference_reference = run.preference_reference_identity;
  info.ema = run.ema.get();
  if (config.training.keep_best > 0) info.extra[kBestCheckpointsKey] = best_checkpoints_json(run.best);
  try {
    if (run.async_saver) {
      if (run.async_saver->in_flight()) {
        const auto waited_from = std::chrono::steady_clock::now();
        finish_async_save(run, run.async_saver->wait());
        const double waited_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - waited_from).count();
        run.log(format("training.async_save: iteration %lld waited %.1f ms for the previous save to finish",
                       static_cast<long long>(step), waited_ms));
      }
      const auto staged = state_save_async(*run.async_saver, config.training.save, run.comm(), *run.model, *run.fsdp,
                                           *run.optimizer, info, config.training.keep_latest_k);
      run.log(format("checkpoint of iteration %lld staged in %.1f ms (%.1f MiB on rank 0); writing it in the background",
                     static_cast<long long>(step), staged.ms, staged.bytes / 1048576.0));
      stalled_so_far();
    } else {
      const std::string dir =
          state_save(config.training.save, run.comm(), *run.model, *run.fsdp, run.optimizer.get(), info, stalled_so_far);
      CheckpointPruned pruned;
      const int keep = config.training.keep_latest_k;
      if (run.is_rank0() && keep > 0) pruned = checkpoint_prune(config.training.save, keep, run.lineage);
      finish_save(run, dir, pruned);
    }
  } catch (const Error& e) {
    fail(e.what(), " (training.lr of that step: ", run.schedule.at(step - 1), ")");
  }
}

void settle_async_save(Run& run) {
  if (run.async_saver) finish_async_save(run, run.async_saver->poll());
}

void finish_async_saves(Run& run) {
  if (run.async_saver) finish_async_save(run, run.async_saver->wait());
}

}  // namespace mmtrain
