#include "models/magihuman/ops.h"

#include "core/error.h"

namespace mmtrain::magihuman {

at::Tensor rms_norm_1p(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto t = x.to(at::kFloat);
  t = t * at::rsqrt(t.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (t * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
}

at::Tensor swiglu7(const at::Tensor& x, bool interleaved) {
  auto xf = x.to(at::kFloat);
  const int64_t width = xf.size(-1);
  at::Tensor gate, linear;
  if (interleaved) {
    gate = xf.slice(-1, 0, width, 2);
    linear = xf.slice(-1, 1, width, 2);
  } else {
    auto halves = xf.chunk(2, -1);
    gate = halves[0];
    linear = halves[1];
  }
  gate = at::clamp_max(gate, 7.0);
  linear = at::clamp(linear, -7.0, 7.0);
  return gate * at::sigmoid(1.702 * gate) * (linear + 1.0);
}

at::Tensor gelu7(const at::Tensor& x) {
  auto xf = at::clamp_max(x.to(at::kFloat), 7.0);
  return xf * at::sigmoid(1.702 * xf);
}

at::Tensor fourier_rope(const at::Tensor& coords, const at::Tensor& bands) {
  auto c = coords.to(at::kFloat);
  auto xyz = c.slice(1, 0, 3);
  auto sizes = c.slice(1, 3, 6);
  auto refs = c.slice(1, 6, 9);
  auto scales = (refs - 1) / (sizes - 1);
  scales = at::where((refs == 1) & (sizes == 1), at::ones_like(scales), scales);
  if (!at::isfinite(scales).all().item<bool>())
    fail("coords_mapping: a size of 1 with a reference size != 1 gives an infinite RoPE scale");
  auto centers = (sizes - 1) / 2;
  centers.select(1, 0).zero_();  // centre h and w only, never time
  auto proj = (xyz - centers).unsqueeze(-1) * scales.unsqueeze(-1) * bands.to(at::kFloat);  // [L, 3, B]
  return at::cat({at::sin(proj), at::cos(proj)}, 1).flatten(1);                              // [L, 6B]
}

at::Tensor apply_partial_rope(const at::Tensor& x, const at::Tensor& rope) {
  const int64_t rotated = rope.size(1) / 2 * 2;  // 6B
  const int64_t half = rotated / 2;              // 3B
  auto sin = rope.slice(1, 0, half).unsqueeze(1);          // [L, 1, 3B]
  auto cos = rope.slice(1, half, rotated).unsqueeze(1);
  auto x1 = x.slice(-1, 0, half);
  auto x2 = x.slice(-1, half, rotated);
  auto rest = x.slice(-1, rotated, x.size(-1));
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest}, -1);
}

}  // namespace mmtrain::magihuman
