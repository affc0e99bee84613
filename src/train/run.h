// Run: the pieces of one training run, built from its Config (the build phase), and the small
// questions every phase asks of them (this rank, the log, what the offload tiers moved, which
// samples a step reads). The trainer (train/trainer.h) owns one and passes it to each phase:
//   build (here), start and resume (train/run_start.h), the step and its record
//   (train/step_report.h), saving (train/run_save.h).
#pragma once
#include "checkpoint/async_checkpoint.h"
#include "checkpoint/best_checkpoints.h"
#include "config/config.h"
#include "data/data_loader.h"
#include "dist/device_mesh.h"
#include "dist/runtime.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "offload/offload_tiers.h"
#include "optim/optimizer.h"
#include "optim/ema.h"
#include "optim/lr_schedule.h"
#include "record/memory_profile.h"
#include "record/profiler.h"
#include "train/preference_reference.h"
#include "train/rollout_source.h"
#include "train/save_root_lock.h"
#include "train/state_finite.h"
#include "train/train_step.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

struct Run {
  Config config;
  Runtime runtime;
  std::unique_ptr<DeviceMesh> mesh;
  std::shared_ptr<Model> model;
  std::shared_ptr<OffloadTiers> tiers;  // the offload features' host pool, copy stream and counters
  std::unique_ptr<Fsdp> fsdp;
  std::unique_ptr<Optimizer> optimizer;  // training.optimizer: AdamW, or the 8-bit one
  LrSchedule schedule;
  DataPipeline data;
  std::unique_ptr<MemoryProfile> memory_profile;
  PhaseTimer phase_timer;  // every step: metrics.jsonl phases_ms
  std::unique_ptr<StepProfiler> profiler;
  std::unique_ptr<SaveRootLock> save_lock;  // rank 0, while training.save is set
  std::unique_ptr<AsyncCheckpointSaver> async_saver;  // training.async_save
  int64_t start_step = 0;  // optimizer steps already taken
  std::string lineage;     // this run's line of checkpoints (sharded_checkpoint.h): continued on resume
  std::vector<BestCheckpoint> best;  // training.keep_best: lowest eval_loss first; continued on resume
  nlohmann::json lora_base;  // features.enable_lora: the base the adapters train over (train/build.h); else null
  // A full fine-tuning preference run's frozen reference and its identity (train/preference_reference.h); else null.
  std::shared_ptr<PreferenceReference> preference_reference;
  nlohmann::json preference_reference_identity;
  std::unique_ptr<RolloutSource> rollouts;  // training.objective grpo: its rollouts (train/rollout_source.h); else null
  std::unique_ptr<Ema> ema;  // training.ema (optim/ema.h): from the weights the run starts with, or its checkpoint's
  StateFiniteness finiteness;  // whether a step made a weight NaN/Inf (train/state_finite.h)
  double baseline_rss_mb = 0;  // before the model is built: the runtime and the data pipeline

  Comm& comm() const { return *runtime.comm; }
  bool is_rank0() const { return runtime.env.rank == 0; }
  // A line on rank 0's console, "[mmtrain] message".
  void log(const std::string& message) const;

  // What the offload tiers have moved so far, and the time waited on them.
  OffloadCounts offload_counts() const;
  // Where swapped state goes (optim/swapped_state.h): the disk tier (training.offload_dir's
  // file), or a host tier of its own moved through windows on the shards' device.
  std::shared_ptr<TierStore> swap_store(bool on_disk) const;
  // Every rank's `text` on rank 0, in rank order (empty on the others), through files
  // <dir>/.<name>.rank<r> each rank writes and rank 0 reads and removes; dir must exist. Collective.
  std::vector<std::string> texts_to_rank0(const std::string& dir, const std::string& name, const std::string& text) const;
  // The run's data order in one line (samples, global batch, shuffle, token budget, loader).
  std::string describe_data_order() const;
  // The samples of step `step` (0-based) over all ranks, for a failure's message: their stream
  // positions and the first few samples by what the dataset calls them (a file, a record).
  std::string describe_step_samples(int64_t step) const;
};

// The build phase: the world resolved and checked, the pre-flight, the save root locked, the mesh,
// the data (first: a bad path fails in seconds), the model as shapes checked against the memory
// there is, the offload tiers, the parallelize chain, AdamW, the schedule and the profilers.
// Weights are not loaded yet (train/run_start.h decides between a resume and initial weights).
// run.config and run.runtime are set; fills in the rest.
void build_run(Run& run);

}  // namespace mmtrain
