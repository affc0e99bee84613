// Fused CPU kernels for MagiHuman's row-wise ops (RMSNorm(1+w), partial RoPE, SwiGLU7, GELU7), with the contracts
// of the reference ATen ops in ops.h, which stay the oracle; model.config.fused_ops picks one set.
// Each op is one custom autograd Function: forward and backward are each one pass over the rows
// (at::parallel_for; RMSNorm's forward two), load fp32/bf16/fp16 and compute in fp32 (double
// inputs compute in double, for gradchecks), and save only their inputs (RMSNorm: x, (1 + w) and
// the per-row rsqrt): the backward
// recomputes the rest, where the reference graph keeps several full-size fp32 intermediates.
// Every result, gradients included, is independent of the thread count.
//   fused_rms_norm_1p(x [N, D] or [N, H, D], w [D], eps) -> x's dtype; grads dx, dw (w's dtype)
//   fused_swiglu7(u [N, 2I], interleaved)                  -> [N, I] fp32; grad du (u's dtype)
//   fused_gelu7(u [N, W])                                  -> [N, W] fp32; grad du
//   fused_partial_rope(x [N, H, hd], rope [N, 6B])         -> [N, H, hd] fp32; grads dx, drope
// Exactness against ops.h, fp32 and bf16 inputs (tests/magihuman/fused_ops_test.cpp, docs/fused_ops.md):
//   rms_norm_1p: forward bitwise (ATen's own mean on cache-resident blocks, ATen's rsqrt); backward is
//     the closed form: dx, dw within ~2e-7 relative L2 of the reference autograd;
//   swiglu7, gelu7: forward and du bitwise with one thread (sigmoid is ATen's own kernel); with more,
//     the few elements the reference sends through its scalar exp (ends of its thread chunks) <= 2 ulp;
//   partial_rope: forward bitwise; dx bitwise for fp32 x (bf16 x: one rounding instead of the
//     reference's two); drope within ~1e-7 relative L2.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain::magihuman {

at::Tensor fused_rms_norm_1p(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor fused_swiglu7(const at::Tensor& u, bool interleaved);
at::Tensor fused_gelu7(const at::Tensor& u);
// x [N, H, hd], rope [N, 6B] (sin then cos, ops.h fourier_rope); rotates dims [0, 6B) in pairs
// (j, j + 3B), copies the rest.
at::Tensor fused_partial_rope(const at::Tensor& x, const at::Tensor& rope);

}  // namespace mmtrain::magihuman
