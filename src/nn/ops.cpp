#include "nn/ops.h"

#include "nn/fused_ops.h"

namespace mmtrain {

at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(at::kFloat);
  xf = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * xf.to(x.scalar_type());
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // The fused kernel returns x's dtype: the reference's result dtype only when w's is the same.
  if (x.is_cpu() && weight.is_cpu() && weight.scalar_type() == x.scalar_type()) return fused_rms_norm(x, weight, eps);
  return rms_norm_aten(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t head_dim, double theta) {
  auto exponents = at::arange(0, head_dim, 2, positions.options().dtype(at::kLong)).to(at::kFloat) /
                   static_cast<double>(head_dim);
  auto inv_freq = 1.0 / at::pow(theta, exponents);
  auto freqs = at::outer(positions.to(at::kFloat), inv_freq);
  auto emb = at::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

static at::Tensor rotate_half(const at::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

at::Tensor apply_rope_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  // [S, hd] -> [S, 1, hd] to broadcast over heads.
  auto c = cos.to(x.scalar_type()).unsqueeze(-2);
  auto s = sin.to(x.scalar_type()).unsqueeze(-2);
  return x * c + rotate_half(x) * s;
}

at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t hd = x.size(-1), heads = x.dim() >= 2 ? x.size(-2) : 1, positions = cos.size(0);
  const bool fusable = x.is_cpu() && x.dim() >= 3 && hd % 2 == 0 && cos.dim() == 2 && cos.size(1) == hd &&
                       sin.sizes() == cos.sizes() && x.size(-3) == positions;
  if (!fusable) return apply_rope_aten(x, cos, sin);
  // rotate-half is the partial RoPE kernel with a full-width table: rows [sin | cos] of half width,
  // pairing dim j with j + hd/2. One table row per token row of x (the batch repeats the positions).
  const int64_t half = hd / 2, rows = x.numel() / (heads * hd);
  auto rope = at::cat({sin.narrow(1, 0, half), cos.narrow(1, 0, half)}, 1).to(at::kFloat);
  if (rows != positions) rope = rope.repeat({rows / positions, 1});
  return fused_partial_rope(x.reshape({rows, heads, hd}), rope).to(x.scalar_type()).view(x.sizes());
}

at::Tensor silu_mul_aten(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  if (gate.is_cpu() && up.is_cpu() && gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type())
    return fused_silu_mul(gate, up);
  return silu_mul_aten(gate, up);
}

at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2) {
  return at::linear(silu_mul(at::linear(x, w1), at::linear(x, w3)), w2);
}

}  // namespace mmtrain
