#include "nn/ops.h"

namespace mmtrain {

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(at::kFloat);
  xf = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * xf.to(x.scalar_type());
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t head_dim, double theta) {
  auto exponents = at::arange(0, head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(head_dim);
  auto inv_freq = 1.0 / at::pow(theta, exponents);
  auto freqs = at::outer(positions.to(at::kFloat), inv_freq);
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

static at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // [S, hd] -> [S, 1, hd] to broadcast over heads.
  auto c = cos.to(x.scalar_type()).unsqueeze(-2);
  auto s = sin.to(x.scalar_type()).unsqueeze(-2);
  return x * c + rotate_half(x) * s;
}

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2) {
  return at::linear(at::silu(at::linear(x, w1)) * at::linear(x, w3), w2);
}

}  // namespace mmtrain
