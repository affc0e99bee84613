// Upstream MagiHuman's sampler schedule: FlowUniPCMultistepScheduler (inference/pipeline/
// scheduler_unipc.py at 209209b) as the base pipeline configures it: UniPC of order 2 with the
// B(h) = e^h - 1 variant ("bh2"), predicting x0 from a flow velocity, lower orders in the final
// step, no corrector disabled, final sigma 0. docs/sampling.md writes the algorithm down.
//
// The scalars (sigmas, log-SNRs, the B(h) coefficients) are 0-dim fp32 tensors, computed with the
// same ops in the same order as upstream's PyTorch code, so a step is bitwise upstream's on the
// same inputs; the latents may have any shape ([z, T, h, w] video, [Na, C] audio).
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

namespace mmtrain::sample {

class FlowUniPCScheduler {
 public:
  static constexpr int64_t kTrainTimesteps = 1000;
  static constexpr int kOrder = 2;

  // set_timesteps(steps, shift): sigma_i = shift s / (1 + (shift - 1) s) over s = linspace(0.999, 0,
  // steps + 1)[:-1] (in float64, then float32), then a final 0; timestep_i = int64(sigma_i * 1000).
  FlowUniPCScheduler(int64_t steps, double shift);

  int64_t steps() const { return static_cast<int64_t>(timesteps_.size()); }
  const std::vector<int64_t>& timesteps() const { return timesteps_; }
  const at::Tensor& sigmas() const { return sigmas_; }  // [steps + 1] fp32, the last 0

  // One UniPC step at the current index (then the next): the velocity v is converted to
  // x0 = x - sigma_i v, the corrector (UniC) refines x with it, the predictor (UniP) moves to sigma_{i+1}.
  at::Tensor step(const at::Tensor& velocity, const at::Tensor& sample);

  // The one-forward (cfg_number 1) update at index i: x0 = x - sigma_i v, then
  // sigma_{i+1} eps + (1 - sigma_{i+1}) x0 with fresh noise eps ~ N(0, 1) from the generator.
  at::Tensor step_ddim(const at::Tensor& velocity, int64_t index, const at::Tensor& sample, at::Generator& generator) const;

 private:
  at::Tensor sigma(int64_t i) const { return sigmas_[i]; }
  // log(1 - sigma) - log(sigma): the log-SNR lambda of sigma_i (+inf at sigma 0).
  at::Tensor lambda(int64_t i) const;
  at::Tensor predictor(const at::Tensor& sample, int order) const;
  at::Tensor corrector(const at::Tensor& this_x0, const at::Tensor& last_sample, const at::Tensor& this_sample,
                       int order) const;

  std::vector<int64_t> timesteps_;
  at::Tensor sigmas_;
  std::array<at::Tensor, kOrder> x0_history_;  // the last two x0 predictions, the newest last
  at::Tensor last_sample_;
  int64_t index_ = 0;
  int lower_order_steps_ = 0;
  int this_order_ = 0;
};

}  // namespace mmtrain::sample
