// tools.memory_profile: how much tensor memory each phase of a step needs. While enabled, the
// CPU allocator is wrapped by a counting one (every tensor allocation and free, on every thread,
// adjusts a live-bytes counter and its peak); each phase (record/step_phases.h: data, forward,
// backward, clip, optimizer) records the peak of live bytes reached inside it. A logged step gains
//   "memory": {"live_start_mb", "data_peak_mb", "forward_peak_mb", "backward_peak_mb",
//              "clip_peak_mb", "optimizer_peak_mb", "step_peak_mb"}   (the max over ranks)
// in metrics.jsonl. These are allocated bytes (torch.cuda.max_memory_allocated's measure), below
// the process RSS, which adds the allocator's slack, the code and the communication buffers.
// CPU only for now: on CUDA the caching allocator's own statistics are the measure to use.
#pragma once
#include "record/step_phases.h"
#include "record/tools_config.h"

#include <array>
#include <cstdint>

namespace mmtrain {

class MemoryProfile : public StepPhaseListener {
 public:
  // Installs the counting allocator (once per process; it stays installed) when config.enable.
  explicit MemoryProfile(const MemoryProfileConfig& config);

  // Whether iteration (1-based) is profiled; the trainer passes this listener to that step only.
  bool covers(int64_t iteration) const;
  void begin_step();
  // This rank's figures of the step just run, in MiB (phase peaks, live bytes at the start).
  struct StepPeaks {
    double live_start_mb = 0;
    std::array<double, kStepPhases> phase_peak_mb{};
    double step_peak_mb = 0;
  };
  StepPeaks end_step() const;

  void phase_begins(StepPhase phase) override;
  void phase_ends(StepPhase phase) override;

 private:
  MemoryProfileConfig config_;
  StepPeaks step_;
};

// Live bytes and peak of the counting allocator (0 until a MemoryProfile installs it); the peak
// restarts from the live bytes at reset_allocation_peak().
int64_t live_allocated_bytes();
int64_t peak_allocated_bytes();
void reset_allocation_peak();

}  // namespace mmtrain
