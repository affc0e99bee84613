#include "optim/adamw.h"

#include "core/error.h"


namespace mmtrain {

AdamW::AdamW(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, AdamWOptions options,
             MomentAllocator allocate_moment)
    : params_(std::move(params)),
      grads_(std::move(grads)),
      allocate_moment_(allocate_moment ? std::move(allocate_moment)
                                       : [](const at::Tensor& p) { return at::zeros_like(p); }),
      options_(options) {
  if (params_.size() != grads_.size()) fail("AdamW: ", params_.size(), " params but ", grads_.size(), " grads");
  for (const auto& p : params_) {
    if (p.scalar_type() != at::kFloat) fail("AdamW: params must be fp32 (the FSDP shards), got ", p.scalar_type());
    steps_.push_back(at::zeros({}, p.options()));
  }
}

void AdamW::materialize() const {
  if (swapped_ || !states_.empty()) return;
  for (const auto& p : params_) states_.push_back({allocate_moment_(p), allocate_moment_(p)});
}

void AdamW::offload_moments(std::shared_ptr<TierStore> store, int64_t chunk_numel) {
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  swapped_ = std::make_unique<SwappedState>(std::move(store), numels, /*tensors_per_param=*/2, chunk_numel);
  // Moments that exist already (steps taken, or set) move; never-used ones never existed: the
  // store starts as zeros.
  for (size_t i = 0; i < states_.size(); ++i)
    if (states_[i].exp_avg.abs().max().item<float>() != 0 || states_[i].exp_avg_sq.abs().max().item<float>() != 0) {
      swapped_->write(i, 0, states_[i].exp_avg);
      swapped_->write(i, 1, states_[i].exp_avg_sq);
    }
  states_.clear();
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_count_;
  paged_non_finite_.reset();
  std::vector<size_t> updating;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].numel() == 0) continue;  // a unit of frozen params only
    steps_[i].fill_(static_cast<double>(step_count_));
    updating.push_back(i);
  }
  if (updating.empty()) return;
  materialize();
  auto run_kernel = [&](const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& grads,
                        const std::vector<at::Tensor>& exp_avgs, const std::vector<at::Tensor>& exp_avg_sqs,
                        const std::vector<at::Tensor>& steps) {
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, lr, options_.beta1,
                      options_.beta2, options_.weight_decay, options_.eps, /*amsgrad=*/false, /*maximize=*/false);
  };
  if (!swapped_) {  // one kernel call over every param that updates
    if (before_update_)
      for (size_t i : updating) before_update_(i);
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    for (size_t i : updating) {
      params.push_back(params_[i]);
      grads.push_back(grads_[i]);
      exp_avgs.push_back(states_[i].exp_avg);
      exp_avg_sqs.push_back(states_[i].exp_avg_sq);
      steps.push_back(steps_[i]);
    }
    run_kernel(params, grads, exp_avgs, exp_avg_sqs, steps);
    if (after_update_)
      for (size_t i : updating) {
        check_paged(i, 0, params_[i]);
        after_update_(i);
      }
    return;
  }
  std::optional<size_t> current;  // the param being updated (resident)
  swapped_->stream(updating, [&](size_t i, int64_t begin, std::vector<at::Tensor>& chunk) {
    at::Tensor& exp_avg = chunk[0];
    at::Tensor& exp_avg_sq = chunk[1];
    if (current != i) {
      if (current && after_update_) after_update_(*current);
      if (before_update_) before_update_(i);
      current = i;
    }
    const int64_t n = exp_avg.numel();
    // A window away from the params (the disk tier's RAM windows, params on a GPU) visits them.
    const at::Device where = params_[i].device();
    at::Tensor avg = exp_avg.to(where), avg_sq = exp_avg_sq.to(where);
    run_kernel({params_[i].reshape(-1).narrow(0, begin, n)}, {grads_[i].reshape(-1).narrow(0, begin, n)}, {avg},
               {avg_sq}, {steps_[i]});
    if (!avg.is_same(exp_avg)) {
      exp_avg.copy_(avg);
      exp_avg_sq.copy_(avg_sq);
    }
    // Params that leave memory after their update (set_residency) are checked here, in the chunk;
    // resident ones are read whole after the step (train/state_finite.h).
    check_paged(i, begin, params_[i].reshape(-1).narrow(0, begin, n));
  });
  if (current && after_update_) after_update_(*current);
}

AdamWState AdamW::moments(size_t i) const {
  if (i >= params_.size()) fail("AdamW: moments of param ", i, " of ", params_.size());
  if (!swapped_) {
    materialize();
    return states_[i];
  }
  return {swapped_->read(i, 0).view(params_[i].sizes()), swapped_->read(i, 1).view(params_[i].sizes())};
}

at::Tensor AdamW::moment_range(size_t i, bool exp_avg_sq, int64_t begin, int64_t numel) const {
  if (i >= params_.size()) fail("AdamW: moments of param ", i, " of ", params_.size());
  if (swapped_) return swapped_->read_range(i, exp_avg_sq ? 1 : 0, begin, numel);
  materialize();
  const at::Tensor& moment = exp_avg_sq ? states_[i].exp_avg_sq : states_[i].exp_avg;
  return moment.view(-1).narrow(0, begin, numel);
}

void AdamW::set_moments(size_t i, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq) {
  if (i >= params_.size()) fail("AdamW: moments of param ", i, " of ", params_.size());
  for (const auto* m : {&exp_avg, &exp_avg_sq})
    if (m->sizes() != params_[i].sizes())
      fail("AdamW: moments of param ", i, " must be shaped ", params_[i].sizes(), ", got ", m->sizes());
  if (swapped_) {
    swapped_->write(i, 0, exp_avg);
    swapped_->write(i, 1, exp_avg_sq);
    return;
  }
  materialize();
  states_[i].exp_avg.copy_(exp_avg);
  states_[i].exp_avg_sq.copy_(exp_avg_sq);
}

int64_t AdamW::state_bytes() const {
  if (swapped_) return swapped_->window_bytes();
  int64_t bytes = 0;  // what the in-memory moments hold, or will from the first step
  for (const auto& p : params_) bytes += 2 * p.numel() * static_cast<int64_t>(sizeof(float));
  return bytes;
}

}  // namespace mmtrain
