// AdamW over flat fp32 shards: torch.optim.AdamW(fused=True), by calling the same ATen kernel
// (at::_fused_adamw_): decoupled weight decay, bias-corrected moments, eps added after the sqrt,
// one pass over param, grad and both moments per step. Elementwise, so a flat shard with zero
// padding behaves exactly like the per-parameter update (padding stays 0), and so does a chunk of
// it: with the moments swapped out (offload_moments: host memory or the disk) the same kernel runs
// chunk by chunk over windows streamed from there, bitwise equal to the in-memory step.
#pragma once
#include "optim/optimizer.h"
#include "optim/swapped_state.h"

#include <ATen/ATen.h>

#include <functional>
#include <memory>
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

class AdamW : public Optimizer {
 public:
  // Zeroed moments for a param (fsdp cpu_offload: from the host tier); null: at::zeros_like.
  using MomentAllocator = std::function<at::Tensor(const at::Tensor& param)>;

  // params and grads are parallel lists of fp32 tensors that stay the same objects all run. The
  // moments are allocated when first needed (the first step or set_moments), so that moments
  // offloaded before that (offload_moments) never exist in memory, not even for a moment.
  AdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, AdamWOptions options,
        MomentAllocator allocate_moment = nullptr);

  // Moves the moments into the store (training.optimizer adamw_swap: the host tier, or the disk
  // with training.offload_dir): from here on they stream through windows of chunk_numel elements
  // (optim/swapped_state.h) and state_bytes() counts only those windows.
  void offload_moments(std::shared_ptr<TierStore> store, int64_t chunk_numel);
  const SwappedState* swapped_moments() const { return swapped_.get(); }

  void step(double lr) override;

  // Param i's moments: the live tensors when they are in memory (created by this call if no step
  // has run yet); when they are swapped out, host tensors from the store, never a device window
  // (the host tier's are its own bytes: read them only; SwappedState::read).
  AdamWState moments(size_t i) const;
  // Elements [begin, begin + numel) of one of param i's flat moments (exp_avg, or exp_avg_sq), the
  // same way: a checkpoint save reads one tensor's moments at a time.
  at::Tensor moment_range(size_t i, bool exp_avg_sq, int64_t begin, int64_t numel) const;
  // Overwrites param i's moments with copies of these (shaped like the param).
  void set_moments(size_t i, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

  int64_t state_bytes() const override;  // memory the moments hold where the update runs

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;
  // Allocates the in-memory moments (zeros) unless they exist or are offloaded. Const: asking for
  // the live moments (moments()) creates them.
  void materialize() const;

  MomentAllocator allocate_moment_;
  mutable std::vector<AdamWState> states_;  // empty until materialize(), and for good once offloaded
  std::unique_ptr<SwappedState> swapped_;  // exp_avg, exp_avg_sq
  std::vector<at::Tensor> steps_;  // per param, fp32 scalar = step_count_ (the kernel's state_steps)
  AdamWOptions options_;
};

}  // namespace mmtrain
