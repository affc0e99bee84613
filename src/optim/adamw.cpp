#include "optim/adamw.h"

#include "core/error.h"

#include <cmath>

namespace mmtrain {

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, AdamWOptions options)
    : params_(std::move(params)), grads_(std::move(grads)), options_(options) {
  if (params_.size() != grads_.size()) fail("AdamW: ", params_.size(), " params but ", grads_.size(), " grads");
  for (const auto& p : params_) states_.push_back({at::zeros_like(p), at::zeros_like(p)});
  masks_.resize(params_.size());
}

void AdamW::set_update_mask(size_t i, at::Tensor mask) {
  if (i >= params_.size()) fail("AdamW: mask for param ", i, " of ", params_.size());
  if (mask.defined() && (mask.sizes() != params_[i].sizes() || mask.scalar_type() != at::kBool))
    fail("AdamW: mask for param ", i, " must be bool ", params_[i].sizes(), ", got ", mask.sizes());
  masks_[i] = std::move(mask);
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_count_;
  const double bias_correction1 = 1.0 - std::pow(options_.beta1, static_cast<double>(step_count_));
  const double bias_correction2 = 1.0 - std::pow(options_.beta2, static_cast<double>(step_count_));
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);  // as Python: x ** 0.5
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& param = params_[i];
    const auto& grad = grads_[i];
    auto& state = states_[i];
    const auto& mask = masks_[i];
    at::Tensor before;
    if (mask.defined()) {
      if (!mask.any().item<bool>()) continue;  // wholly frozen: no update, moments stay zero
      before = param.clone();
    }
    // The same op sequence as torch.optim.adamw._single_tensor_adamw, so results match bitwise.
    param.mul_(1.0 - lr * options_.weight_decay);
    state.exp_avg.lerp_(grad, 1.0 - options_.beta1);
    state.exp_avg_sq.mul_(options_.beta2).addcmul_(grad, grad, 1.0 - options_.beta2);
    auto denom = (state.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(options_.eps);
    param.addcdiv_(state.exp_avg, denom, -step_size);
    if (mask.defined()) param.copy_(at::where(mask, param, before));
  }
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : states_)
    bytes += (s.exp_avg.numel() + s.exp_avg_sq.numel()) * s.exp_avg.element_size();
  return bytes;
}

}  // namespace mmtrain
