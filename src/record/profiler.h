// tools.profile: a Chrome-trace JSON of steps [start_step, end_step] on the chosen ranks, through
// LibTorch's Kineto profiler (the profiler behind torch.profiler). The trace holds every ATen op
// (with input shapes under record_shapes, allocation rows under with_memory), the Gloo/NCCL
// collectives, one "ProfilerStep#N" scope per iteration and mmtrain's own scopes:
// mmtrain::data|forward|backward|optimizer (train/train_step.h) and fsdp::all_gather,
// fsdp::wait_all_gather, fsdp::reduce_scatter, fsdp::wait_reduce_scatter per FSDP unit.
// Open <save_path>/rank<R>.pt.trace.json in https://ui.perfetto.dev or chrome://tracing.
#pragma once
#include "record/tools_config.h"

#include <ATen/record_function.h>

#include <cstdint>
#include <optional>
#include <string>

namespace mmtrain {

class StepProfiler {
 public:
  // save_dir: where traces go (tools.profile.save_path resolved); cuda adds device activity.
  StepProfiler(const ProfileConfig& config, int rank, std::string save_dir, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Around every iteration (1-based). true from begin_step to end_step when this step is traced.
  void begin_step(int64_t iteration);
  void end_step(int64_t iteration);
  bool tracing() const { return active_; }
  // The trace this rank writes ("" when it traces nothing).
  std::string trace_path() const;

 private:
  void stop_and_save();

  ProfileConfig config_;
  int rank_;
  std::string save_dir_;
  bool cuda_;
  bool this_rank_ = false;
  bool active_ = false;
  std::optional<at::RecordFunction> step_scope_;
};

}  // namespace mmtrain
