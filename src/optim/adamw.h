// AdamW over flat fp32 shards: torch.optim.AdamW(fused=True), by calling the same ATen kernel
// (at::_fused_adamw_): decoupled weight decay, bias-corrected moments, eps added after the sqrt,
// one pass over param, grad and both moments per step. Elementwise, so a flat shard with zero
// padding behaves exactly like the per-parameter update (padding stays 0).
#pragma once
#include <ATen/ATen.h>

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

  void step(double lr);
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t step) { step_count_ = step; }
  std::vector<AdamWState>& states() { return states_; }
  const std::vector<AdamWState>& states() const { return states_; }
  int64_t state_bytes() const;

 private:
  std::vector<at::Tensor> params_;
  std::vector<at::Tensor> grads_;
  std::vector<AdamWState> states_;
  std::vector<at::Tensor> masks_;  // per param, undefined = update everything
  std::vector<at::Tensor> steps_;  // per param, fp32 scalar = step_count_ (the kernel's state_steps)
  AdamWOptions options_;
  int64_t step_count_ = 0;
};

}  // namespace mmtrain
