// Where a rank's bytes sit under each combination of the offload features: the device, the host
// tier (pinned RAM) and the disk tier, from the FSDP memory plan and the activation estimate.
// `mmtrain plan` prints the table; the rules mirror what the features do:
//   activation offload: of what the n layers keep for backward (their inputs under recompute,
//     every saved tensor without), n - 1 layers' worth go to the host, and the device keeps two
//     layers' worth at a time (the one in use and the one in flight: sent, or prefetched);
//   cpu_offload: the fp32 shards, their grads and the moments go to the host; the device keeps
//     a reduce buffer per reduction in flight for the grads on their way there;
//   adamw_swap: the moments go to the host tier, three chunk windows stay where the step runs;
//   adamw_swap + offload_dir: the moments go to disk, the windows are host RAM;
//   cpu_offload + offload_dir: the moments (as above) and the fp32 shards go to disk; host RAM
//     keeps two units' shards at a time (the one being gathered or updated, the next read ahead);
//   adamw8bit + offload_dir: its 8-bit state goes to disk, two units' of it stay in host RAM
//     (window_bytes), and with cpu_offload the shards go to disk as above.
// On CPU the device is the host: there the device and host columns share one RAM.
#pragma once
#include "fsdp/plan.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mmtrain {

struct Config;

struct OffloadSetting {
  bool activations = false;  // features.enable_activation_offload
  bool cpu_offload = false;  // parallel.fsdp_plan.cpu_offload
  bool swap = false;         // the optimizer state off where the update runs (training.optimizer adamw_swap, or
                             // offload_dir with cpu_offload or adamw8bit)
  bool disk = false;         // training.offload_dir
  bool state_8bit = false;   // training.optimizer adamw8bit: with swap, its state on disk
  std::string name() const;  // "none", "activations+cpu_offload+adamw_swap(disk)", ...
  bool operator==(const OffloadSetting& o) const {
    return activations == o.activations && cpu_offload == o.cpu_offload && swap == o.swap && disk == o.disk &&
           state_8bit == o.state_8bit;
  }

  static OffloadSetting of(const Config& config);
  // Each feature alone and the useful combinations.
  static std::vector<OffloadSetting> all();
  // The settings a run of training.optimizer `optimizer` can use: adamw8bit's update runs on the
  // host (optim/adamw8bit.h), so its state is never swapped to the host tier, only to the disk.
  static std::vector<OffloadSetting> all_for(const std::string& optimizer);
};

struct OffloadPlanInputs {
  const FsdpMemoryPlan* fsdp = nullptr;
  int64_t other_device_bytes = 0;    // besides sharded state and gathered units (context-parallel buffers)
  int64_t activation_bytes = 0;      // as the config runs (with or without recompute); 0 when not estimated
  int64_t layers_kept_bytes = 0;     // of that, what the layers keep for backward (inputs under recompute)
  int64_t num_layers = 0;
  int64_t window_bytes = 0;          // adamw_swap's three chunk windows, or adamw8bit's two units on disk
  int64_t ema_bytes = 0;             // training.ema's fp32 shadows: beside the shards (the host under cpu_offload),
  std::string ema_offload = "none";  // or in the host or disk tier (training.ema.offload), where they leave
  int64_t ema_window_bytes = 0;      // their three chunk windows beside the shards (host RAM for the disk's)
};

struct TierBytes {
  int64_t device = 0, host = 0, disk = 0;
};

TierBytes offload_tier_bytes(const OffloadPlanInputs& in, const OffloadSetting& setting);

// What a rank holds beyond its steady step, per tier, in the phases around the step, with U the
// largest unit's fp32 shard (train/state.cpp, fsdp/fully_shard.cpp, fsdp/shard_pager.h). Shards on
// disk page through the two buffers the step holds for them (the unit in use, the one read ahead)
// in every phase, so they add nothing here.
//   start-up: one parameter whole in host RAM (its seeded init, or its tensor from the HF files);
//   save (synchronous): a tensor at a time: where the moments are on disk one tensor's moment
//     read back (at most U), and where the state is on a GPU each tensor's copy to the host (at
//     most U); the host tier's and the CPU's own tensors are written in place;
//   async save (training.async_save): every trained tensor of the rank staged in host RAM
//     (weights and moments), where training goes on from;
//   resume: a unit's two moments staged where the shards live (2 U), the rows being read (at
//     most U of host RAM), and with the moments on disk one U on its way there.
// device_is_host: a CPU run (nothing is copied to the host to be written). saves_frozen: the
// checkpoint holds the frozen params too (false for LoRA, whose base is its model weights).
// evaluation and sampling: not offload rules (offload_phase_bytes leaves them zero):
// PlanEstimate::phase_bytes fills them (plan/plan_estimate.h, plan/sampling_plan.h).
struct PhaseBytes {
  TierBytes startup, save, async_save, resume, evaluation, sampling, rollout;
};
PhaseBytes offload_phase_bytes(const FsdpMemoryPlan& plan, const OffloadSetting& setting, bool device_is_host,
                               bool saves_frozen);

// The phases a run of `config` goes through beside its steps, named for messages: start-up, the
// save it asks for (synchronous, or training.async_save's staging), when it loads the resume, and
// when it evaluates (training.eval_interval, eval_at_start) an evaluation, and when it samples
// (training.sample_interval, sample_at_start) a sampling phase, and GRPO's rollout every step.
// The pre-flight, `plan --auto` and the run's own prediction all count the largest of these.
struct Phase {
  const char* name;
  TierBytes bytes;
};
std::vector<Phase> config_phases(const PhaseBytes& phases, const Config& config);
// The phase with the most bytes by bytes_of (the first of equals), never empty: start-up is in
// every run.
struct PhasePeak {
  const char* name;
  int64_t bytes;
};
PhasePeak largest_phase(const std::vector<Phase>& phases, const std::function<int64_t(const TierBytes&)>& bytes_of);

}  // namespace mmtrain
