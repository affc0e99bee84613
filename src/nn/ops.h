// Building blocks shared by the Llama-family models (the test transformer, Mistral3). Shapes: B
// batch, S sequence, H hidden, nh / nkv query / key-value heads, hd head dim.
// On CPU each op runs its fused kernel (nn/fused_ops.h: one pass forward, one backward, inputs
// saved instead of intermediates); elsewhere, and as the oracle the fused kernels are tested
// against, the *_aten compositions, which follow HF transformers op for op.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain {

// HF Llama RMSNorm: normalize in fp32, cast back to x's dtype, then scale: w * norm(x).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary tables for positions [S] (float) and head_dim hd, rotate-half convention:
// returns {cos, sin}, each [S, hd] in fp32, each holding the same values in both halves.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t head_dim, double theta);

// x [..., S, heads, hd] * cos + rotate_half(x) * sin, with cos/sin [S, hd] cast to x's dtype.
// The fused path reads only the first half of each table: both halves must be equal, as
// rope_tables (and every rotate-half table built like it) makes them.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor apply_rope_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// silu(gate) * up, the SwiGLU product.
at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up);
at::Tensor silu_mul_aten(const at::Tensor& gate, const at::Tensor& up);

// SwiGLU MLP: w2(silu(w1 x) * w3 x).
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2);

}  // namespace mmtrain
