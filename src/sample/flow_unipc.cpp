#include "sample/flow_unipc.h"

#include "core/error.h"

#include <algorithm>

namespace mmtrain::sample {

namespace {

at::Tensor scalar(double value) { return at::scalar_tensor(value, at::kFloat); }

// B(h) and the right-hand side b of UniPC's order conditions, as upstream builds them:
// hh = -h (x0 prediction), h_phi_1 = expm1(hh), B(h) = expm1(hh) (bh2),
// b_i = h_phi_k i! / B(h) with h_phi_k starting at h_phi_1 / hh - 1, then h_phi_k / hh - 1 / (i + 1)!.
struct Coefficients {
  at::Tensor hh, h_phi_1, b_h;
  std::vector<at::Tensor> b;
};

Coefficients coefficients(const at::Tensor& h, int order) {
  Coefficients c;
  c.hh = -h;
  c.h_phi_1 = at::expm1(c.hh);
  at::Tensor h_phi_k = c.h_phi_1 / c.hh - 1;
  double factorial = 1;
  c.b_h = at::expm1(c.hh);
  for (int i = 1; i <= order; ++i) {
    c.b.push_back(h_phi_k * factorial / c.b_h);
    factorial *= i + 1;
    h_phi_k = h_phi_k / c.hh - 1 / factorial;
  }
  return c;
}

}  // namespace

FlowUniPCScheduler::FlowUniPCScheduler(int64_t steps, double shift) {
  if (steps < 1 || steps > kTrainTimesteps) fail("sampling steps must be in 1..", kTrainTimesteps, ", found ", steps);
  if (!(shift > 0)) fail("sampling shift must be > 0, found ", shift);
  // The training sigmas 1 - linspace(1, 1/1000, 1000)[::-1] in fp32: the first is 0.999, the last 0.
  const double sigma_max = static_cast<double>(static_cast<float>(1.0 - 1.0 / kTrainTimesteps));
  const double sigma_min = 0.0;
  // numpy.linspace(sigma_max, sigma_min, steps + 1): y_i = i * step + start; the last is dropped.
  const double step = (sigma_min - sigma_max) / static_cast<double>(steps);
  std::vector<float> sigmas;
  for (int64_t i = 0; i < steps; ++i) {
    const double s = static_cast<double>(i) * step + sigma_max;
    const double shifted = shift * s / (1 + (shift - 1) * s);
    timesteps_.push_back(static_cast<int64_t>(shifted * kTrainTimesteps));
    sigmas.push_back(static_cast<float>(shifted));
  }
  sigmas.push_back(0.0f);
  sigmas_ = at::tensor(sigmas, at::kFloat);
}

at::Tensor FlowUniPCScheduler::lambda(int64_t i) const {
  const at::Tensor s = sigma(i);
  const at::Tensor alpha = 1 - s;
  return at::log(alpha) - at::log(s);
}

// UniP-order: x_{i+1} = (sigma_{i+1} / sigma_i) x - alpha_{i+1} h_phi_1 m0 - alpha_{i+1} B(h) (rho D1),
// m0 this step's x0, D1 = (m_prev - m0) / r with r = (lambda_{i-1} - lambda_i) / h, rho = 0.5 (order 2).
at::Tensor FlowUniPCScheduler::predictor(const at::Tensor& x, int order) const {
  const at::Tensor& m0 = x0_history_[kOrder - 1];
  const at::Tensor sigma_t = sigma(index_ + 1), sigma_s0 = sigma(index_);
  const at::Tensor alpha_t = 1 - sigma_t;
  const at::Tensor lambda_s0 = lambda(index_);
  const at::Tensor h = lambda(index_ + 1) - lambda_s0;
  const Coefficients c = coefficients(h, order);
  const at::Tensor x_t = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0;
  if (order == 1) return x_t;
  const at::Tensor rk = (lambda(index_ - 1) - lambda_s0) / h;
  const at::Tensor d1 = (x0_history_[kOrder - 2] - m0) / rk;
  return x_t - alpha_t * c.b_h * (scalar(0.5) * d1);
}

// UniC-order, after the fact: the step that produced this_sample from last_sample is redone with
// this step's x0 (model_t) as well: rho = solve(R, b) with R = [[1, 1], [r, 1]] (order 2; 0.5 at order 1),
// x = (sigma_t / sigma_s0) last - alpha_t h_phi_1 m0 - alpha_t B(h) (rho_0 D1 + rho_last (model_t - m0)).
at::Tensor FlowUniPCScheduler::corrector(const at::Tensor& model_t, const at::Tensor& x, const at::Tensor& this_sample,
                                         int order) const {
  (void)this_sample;  // upstream passes it and reads only its device
  const at::Tensor& m0 = x0_history_[kOrder - 1];
  const at::Tensor sigma_t = sigma(index_), sigma_s0 = sigma(index_ - 1);
  const at::Tensor alpha_t = 1 - sigma_t;
  const at::Tensor lambda_s0 = lambda(index_ - 1);
  const at::Tensor h = lambda(index_) - lambda_s0;
  const Coefficients c = coefficients(h, order);
  const at::Tensor x_t = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0;
  const at::Tensor d1_t = model_t - m0;
  if (order == 1) return x_t - alpha_t * c.b_h * (scalar(0.5) * d1_t);
  const at::Tensor rk = (lambda(index_ - 2) - lambda_s0) / h;
  const at::Tensor d1 = (x0_history_[kOrder - 2] - m0) / rk;
  const at::Tensor r = at::stack({at::ones_like(rk), at::ones_like(rk), rk, at::ones_like(rk)}).reshape({2, 2});
  const at::Tensor rho = at::linalg_solve(r, at::stack(c.b));
  return x_t - alpha_t * c.b_h * (rho[0] * d1 + rho[1] * d1_t);
}

at::Tensor FlowUniPCScheduler::step(const at::Tensor& velocity, const at::Tensor& sample) {
  if (index_ >= steps()) fail("FlowUniPCScheduler: step ", index_ + 1, " of ", steps());
  const at::Tensor x0 = sample - sigma(index_) * velocity;
  at::Tensor x = sample;
  if (index_ > 0 && last_sample_.defined()) x = corrector(x0, last_sample_, sample, this_order_);
  x0_history_[0] = x0_history_[1];
  x0_history_[1] = x0;
  const int order = static_cast<int>(std::min<int64_t>(kOrder, steps() - index_));  // lower order at the end
  this_order_ = std::min(order, lower_order_steps_ + 1);                              // and while warming up
  last_sample_ = x;
  const at::Tensor next = predictor(x, this_order_);
  lower_order_steps_ = std::min(lower_order_steps_ + 1, kOrder);
  ++index_;
  return next;
}

at::Tensor FlowUniPCScheduler::step_ddim(const at::Tensor& velocity, int64_t index, const at::Tensor& sample,
                                         at::Generator& generator) const {
  const at::Tensor current = sigma(index), next = sigma(index + 1);
  const at::Tensor noise = at::randn(sample.sizes(), generator, sample.options());
  const at::Tensor clean = sample - current * velocity;
  return next * noise + (1 - next) * clean;
}

}  // namespace mmtrain::sample
