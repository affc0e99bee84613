#include "optim/ema.h"

#include "core/config_schema.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>
#include <optional>

namespace mmtrain {

void EmaConfig::declare(ConfigSection<EmaConfig>& s) {
  using E = EmaConfig;
  s.field("enable", &E::enable)
      .field("decay", &E::decay)
      .field("min_decay", &E::min_decay)
      .field("update_after_step", &E::update_after_step)
      .field("use_ema_warmup", &E::use_ema_warmup)
      .field("inv_gamma", &E::inv_gamma)
      .field("power", &E::power)
      .field("update_every", &E::update_every)
      .field("offload", &E::offload)
      .check([](const EmaConfig& c, const ConfigCheck& check) {
        check.one_of("offload", c.offload, {"none", "host", "disk"});
        const auto number = ConfigCheck::number;
        if (!(c.decay >= 0.0 && c.decay <= 1.0)) check.invalid("decay", "in [0, 1]", number(c.decay));
        if (!(c.min_decay >= 0.0 && c.min_decay <= c.decay))
          check.invalid("min_decay", "in [0, decay]", number(c.min_decay));
        if (c.update_after_step < 0) check.invalid("update_after_step", ">= 0", std::to_string(c.update_after_step));
        if (!(c.inv_gamma > 0.0) || !std::isfinite(c.inv_gamma)) check.invalid("inv_gamma", "> 0", number(c.inv_gamma));
        if (!(c.power > 0.0) || !std::isfinite(c.power)) check.invalid("power", "> 0", number(c.power));
        if (c.update_every < 1) check.invalid("update_every", ">= 1", std::to_string(c.update_every));
      });
}

double ema_decay(const EmaConfig& c, int64_t update) {
  const int64_t step = std::max<int64_t>(0, update - c.update_after_step - 1);
  if (step <= 0) return 0.0;
  const double j = static_cast<double>(step);
  // diffusers computes these in Python floats (double): so here.
  double decay = c.use_ema_warmup ? 1.0 - std::pow(1.0 + j / c.inv_gamma, -c.power) : (1.0 + j) / (10.0 + j);
  decay = std::min(decay, c.decay);
  return std::max(decay, c.min_decay);
}

int64_t ema_updates_by(const EmaConfig& c, int64_t step) { return step / c.update_every; }

Ema::Ema(EmaConfig config, std::vector<at::Tensor> params, std::shared_ptr<TierStore> store, int64_t chunk_numel,
         Residency residency)
    : config_(config), params_(std::move(params)), residency_(std::move(residency)) {
  std::vector<int64_t> numels;
  for (const auto& p : params_) {
    if (p.scalar_type() != at::kFloat) fail("training.ema: expected fp32 shards, found ", p.scalar_type());
    numels.push_back(p.numel());
    if (!store) shadows_.push_back(at::empty(p.sizes(), p.options()));  // a paged-out shard's storage is empty
  }
  if (store) swapped_ = std::make_unique<SwappedState>(std::move(store), numels, /*tensors_per_param=*/1, chunk_numel);
  at::NoGradGuard no_grad;
  for_each_chunk(false, [](size_t, at::Tensor& shadow, const at::Tensor& param) { shadow.copy_(param); });
}

void Ema::for_each_chunk(bool changes_params, const std::function<void(size_t, at::Tensor&, const at::Tensor&)>& fn) {
  auto bring_in = [this](size_t i) {
    if (residency_.before) residency_.before(i);
  };
  auto let_go = [this, changes_params](size_t i) {
    if (residency_.after) residency_.after(i, changes_params);
  };
  std::vector<size_t> trained;
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].numel() > 0) trained.push_back(i);  // else a unit of frozen params only
  if (!swapped_) {
    for (size_t i : trained) {
      bring_in(i);
      at::Tensor shadow = shadows_[i].view(-1);
      fn(i, shadow, params_[i].view(-1));
      let_go(i);
    }
    return;
  }
  std::optional<size_t> current;  // the param whose chunks are streaming (resident)
  swapped_->stream(trained, [&](size_t i, int64_t begin, std::vector<at::Tensor>& chunk) {
    if (current != i) {
      if (current) let_go(*current);
      bring_in(i);
      current = i;
    }
    const at::Tensor param = params_[i].view(-1).narrow(0, begin, chunk[0].numel());
    // A window away from the shards (the disk tier's RAM windows, shards on a GPU) visits them.
    at::Tensor shadow = chunk[0].to(param.device());
    fn(i, shadow, param);
    if (!shadow.is_same(chunk[0])) chunk[0].copy_(shadow);
  });
  if (current) let_go(*current);
}

void Ema::after_step(int64_t step) {
  if (step % config_.update_every != 0) return;
  const double one_minus_decay = 1.0 - ema_decay(config_, ema_updates_by(config_, step));
  at::NoGradGuard no_grad;
  // EMAModel.step: s_param.sub_(one_minus_decay * (s_param - param)).
  for_each_chunk(false, [one_minus_decay](size_t, at::Tensor& shadow, const at::Tensor& param) {
    shadow.sub_((shadow - param) * one_minus_decay);
  });
}

void Ema::swap_with_params() {
  at::NoGradGuard no_grad;
  for_each_chunk(true, [](size_t, at::Tensor& shadow, const at::Tensor& param) {
    const auto weights = param.clone();
    param.copy_(shadow);
    shadow.copy_(weights);
  });
}

at::Tensor Ema::shadow_range(size_t i, int64_t begin, int64_t numel) const {
  if (i >= params_.size()) fail("training.ema: shadow ", i, " of ", params_.size());
  if (swapped_) return swapped_->read_range(i, 0, begin, numel);
  return shadows_[i].view(-1).narrow(0, begin, numel);
}

void Ema::set_shadow(size_t i, const at::Tensor& values) {
  if (i >= params_.size()) fail("training.ema: shadow ", i, " of ", params_.size());
  if (values.numel() != params_[i].numel())
    fail("training.ema: shadow ", i, " has ", params_[i].numel(), " elements, the checkpoint's ", values.numel());
  if (swapped_) return swapped_->write(i, 0, values.reshape(-1).contiguous());
  shadows_[i].copy_(values.reshape(shadows_[i].sizes()));
}

int64_t Ema::state_bytes() const {
  if (swapped_) return swapped_->window_bytes();
  int64_t bytes = 0;
  for (const auto& s : shadows_) bytes += s.numel() * static_cast<int64_t>(s.element_size());
  return bytes;
}

}  // namespace mmtrain
