#include "optim/adamw.h"

#include "core/error.h"


namespace mmtrain {

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, AdamWOptions options)
    : params_(std::move(params)), grads_(std::move(grads)), options_(options) {
  if (params_.size() != grads_.size()) fail("AdamW: ", params_.size(), " params but ", grads_.size(), " grads");
  for (const auto& p : params_) {
    if (p.scalar_type() != at::kFloat) fail("AdamW: params must be fp32 (the FSDP shards), got ", p.scalar_type());
    states_.push_back({at::zeros_like(p), at::zeros_like(p)});
    steps_.push_back(at::zeros({}, p.options()));
  }
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
  // One kernel call over every param that updates; a masked param keeps a copy of its frozen
  // elements and gets them back afterwards (the kernel has no mask).
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  std::vector<std::pair<size_t, at::Tensor>> restore;  // (param index, values before the step)
  for (size_t i = 0; i < params_.size(); ++i) {
    if (masks_[i].defined()) {
      if (!masks_[i].any().item<bool>()) continue;  // wholly frozen: no update, moments stay zero
      restore.emplace_back(i, params_[i].clone());
    }
    steps_[i].fill_(static_cast<double>(step_count_));
    params.push_back(params_[i]);
    grads.push_back(grads_[i]);
    exp_avgs.push_back(states_[i].exp_avg);
    exp_avg_sqs.push_back(states_[i].exp_avg_sq);
    steps.push_back(steps_[i]);
  }
  if (params.empty()) return;
  at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                    options_.beta2, options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  for (auto& [i, before] : restore) params_[i].copy_(at::where(masks_[i], params_[i], before));
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : states_)
    bytes += (s.exp_avg.numel() + s.exp_avg_sq.numel()) * s.exp_avg.element_size();
  return bytes;
}

}  // namespace mmtrain
