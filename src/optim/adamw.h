// AdamW over flat fp32 shards: torch.optim.AdamW(fused=True), by calling the same ATen kernel
// (at::_fused_adamw_): decoupled weight decay, bias-corrected moments, eps added after the sqrt,
// one pass over param, grad and both moments per step. Elementwise, so a flat shard with zero
// padding behaves exactly like the per-parameter update (padding stays 0), and so does a chunk of
// it: with the moments on disk (offload_moments) the same kernel runs chunk by chunk over windows
// streamed from the file, bitwise equal to the in-memory step.
#pragma once
#include "optim/disk_moments.h"

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

struct AdamWState {
  at::Tensor exp_avg;     // fp32, like the param
  at::Tensor exp_avg_sq;  // fp32, like the param
};

class AdamW {
 public:
  // params and grads are parallel lists of fp32 tensors that stay the same objects all run.
  AdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, AdamWOptions options);

  // Restricts updates of params[i] to where mask (bool, like the param) is true; elsewhere the
  // param stays bitwise unchanged (frozen params: no decay either). Undefined: update all.
  void set_update_mask(size_t i, at::Tensor mask);

  // Moves the moments into the store's file (training.offload_dir): from here on they stream
  // through RAM windows of chunk_numel elements (optim/disk_moments.h) and state_bytes() counts
  // only those windows.
  void offload_moments(std::shared_ptr<DiskStore> store, int64_t chunk_numel);
  const DiskMoments* disk_moments() const { return disk_.get(); }

  void step(double lr);
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t step) { step_count_ = step; }

  // Param i's moments: the live tensors when they are in memory, a copy read back from the file
  // when they are on disk.
  AdamWState moments(size_t i) const;
  // Overwrites param i's moments with copies of these (shaped like the param).
  void set_moments(size_t i, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

  // The first NaN/Inf in the moments after the last step: in memory every param's are read; on
  // disk the step looked at each chunk while it was in RAM.
  struct NonFiniteMoment {
    size_t param;
    std::string moment;  // "exp_avg" or "exp_avg_sq"
    int64_t element;     // in the param's flat shard
  };
  std::optional<NonFiniteMoment> first_non_finite_moment() const;
  int64_t state_bytes() const;  // RAM the moments hold

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;
  std::vector<AdamWState> states_;  // undefined tensors once offloaded
  std::unique_ptr<DiskMoments> disk_;
  std::optional<NonFiniteMoment> disk_non_finite_;  // seen by the last offloaded step
  std::vector<at::Tensor> masks_;  // per param, undefined = update everything
  std::vector<at::Tensor> steps_;  // per param, fp32 scalar = step_count_ (the kernel's state_steps)
  AdamWOptions options_;
  int64_t step_count_ = 0;
};

}  // namespace mmtrain
