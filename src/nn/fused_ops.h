// Fused CPU kernels for the models' row-wise ops, each with the contract of a reference ATen
// composition that stays the oracle: MagiHuman's RMSNorm(1+w), partial RoPE, SwiGLU7 and GELU7
// (models/magihuman/ops.h; model.config.fused_ops picks one set), and the Llama-family RMSNorm,
// rotate-half RoPE and SwiGLU product of the test transformer and Mistral3 (nn/ops.h), which share
// the RMSNorm and RoPE kernels (the same math with another weight offset / a full-width table).
// Each op is one custom autograd Function: forward and backward are each one pass over the rows
// (at::parallel_for; RMSNorm's forward two), load fp32/bf16/fp16 and compute in fp32 (double
// inputs compute in double, for gradchecks), and save only their inputs (RMSNorm: x, (w + offset)
// and the per-row rsqrt): the backward
// recomputes the rest, where the reference graph keeps several full-size fp32 intermediates.
// Every result, gradients included, is independent of the thread count.
//   fused_rms_norm_1p(x [N, D] or [N, H, D], w [D], eps) -> x's dtype; grads dx, dw (w's dtype)
//   fused_rms_norm(x, w, eps)                              -> the same with w instead of (1 + w)
//   fused_swiglu7(u [N, 2I], interleaved)                  -> [N, I] fp32; grad du (u's dtype)
//   fused_gelu7(u [N, W])                                  -> [N, W] fp32; grad du
//   fused_partial_rope(x [N, H, hd], rope [N, 6B])         -> [N, H, hd] fp32; grads dx, drope
//   fused_silu_mul(g [..], u [..] same shape)              -> silu(g) * u in g's dtype; grads dg, du
// Exactness against the references, fp32 and bf16 inputs (tests/nn/fused_magihuman_ops_test.cpp,
// tests/nn/fused_llama_ops_test.cpp, docs/fused_ops.md):
//   rms_norm_1p, rms_norm: forward bitwise in fp32 (ATen's own mean on cache-resident blocks, ATen's
//     rsqrt; bf16: one rounding where the Llama reference rounds the normalized x first); backward is
//     the closed form: dx, dw within ~2e-7 relative L2 of the reference autograd;
//   swiglu7, gelu7: forward and du bitwise with one thread (sigmoid is ATen's own kernel); with more,
//     the few elements the reference sends through its scalar exp (ends of its thread chunks) <= 2 ulp;
//   partial_rope: forward bitwise; dx bitwise for fp32 x (bf16 x: one rounding instead of the
//     reference's two); drope within ~1e-7 relative L2;
//   silu_mul: g * sigmoid(g) * u with ATen's sigmoid, where ATen's silu computes g / (1 + exp(-g)):
//     a few ulp.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain {

at::Tensor fused_rms_norm_1p(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor fused_swiglu7(const at::Tensor& u, bool interleaved);
at::Tensor fused_gelu7(const at::Tensor& u);
// x [N, H, hd], rope [N, 6B] (sin then cos, ops.h fourier_rope); rotates dims [0, 6B) in pairs
// (j, j + 3B), copies the rest.
at::Tensor fused_partial_rope(const at::Tensor& x, const at::Tensor& rope);
at::Tensor fused_silu_mul(const at::Tensor& gate, const at::Tensor& up);

}  // namespace mmtrain
