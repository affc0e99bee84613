#include "optim/ema.h"

#include "core/config_schema.h"
#include "core/error.h"

#include <algorithm>
#include <cmath>

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
      .check([](const EmaConfig& c, const ConfigCheck& check) {
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

Ema::Ema(EmaConfig config, std::vector<at::Tensor> params) : config_(config), params_(std::move(params)) {
  for (const auto& p : params_) {
    if (p.scalar_type() != at::kFloat) fail("training.ema: expected fp32 shards, found ", p.scalar_type());
    shadows_.push_back(p.detach().clone());
  }
}

void Ema::after_step(int64_t step) {
  if (step % config_.update_every != 0) return;
  const double one_minus_decay = 1.0 - ema_decay(config_, ema_updates_by(config_, step));
  at::NoGradGuard no_grad;
  // EMAModel.step: s_param.sub_(one_minus_decay * (s_param - param)).
  for (size_t i = 0; i < shadows_.size(); ++i) shadows_[i].sub_((shadows_[i] - params_[i]) * one_minus_decay);
}

void Ema::swap_with_params() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < shadows_.size(); ++i) {
    const auto weights = params_[i].clone();
    params_[i].copy_(shadows_[i]);
    shadows_[i].copy_(weights);
  }
}

void Ema::set_shadow(size_t i, const at::Tensor& values) {
  if (values.numel() != shadows_.at(i).numel())
    fail("training.ema: shadow ", i, " has ", shadows_[i].numel(), " elements, the checkpoint's ", values.numel());
  shadows_[i].copy_(values.reshape(shadows_[i].sizes()));
}

int64_t Ema::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : shadows_) bytes += s.numel() * static_cast<int64_t>(s.element_size());
  return bytes;
}

}  // namespace mmtrain
