// MagiHuman's building blocks (upstream daVinci-MagiHuman's dit_module.py), as reference ATen ops with
// autograd. Fused CPU kernels with the same contracts live in nn/fused_ops.h;
// these stay the oracle they are tested against (model.config.fused_ops picks one set).
//   rms_norm_1p:  x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32, result in x's dtype
//   swiglu7:      gate = x[..., :I] (halves layout) or x[..., 0::2] (interleaved),
//                 min(gate, 7) * sigmoid(1.702 * min(gate, 7)) * (clamp(linear, -7, 7) + 1)
//   gelu7:        min(x, 7) * sigmoid(1.702 * min(x, 7))
//   fourier_rope: coords [L, 9] -> [L, 6 * bands] = [sin | cos] of the (t, h, w) angles
//   apply_partial_rope: rotate-half over the first 6 * bands dims of each head, rest untouched
#pragma once
#include <ATen/ATen.h>

namespace mmtrain::magihuman {

at::Tensor rms_norm_1p(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor swiglu7(const at::Tensor& x, bool interleaved);
at::Tensor gelu7(const at::Tensor& x);
// bands [B] fp32; returns [L, 6B] fp32: sin(angles) then cos(angles), angles axis-major (t, h, w).
at::Tensor fourier_rope(const at::Tensor& coords, const at::Tensor& bands);
// x [L, heads, hd] fp32, rope [L, 6B]; rotates dims [0, 6B) with pairs (j, j + 3B).
at::Tensor apply_partial_rope(const at::Tensor& x, const at::Tensor& rope);

}  // namespace mmtrain::magihuman
