// Reference building blocks shared by models. Shapes: B batch, S sequence, H hidden,
// nh / nkv query / key-value heads, hd head dim.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain {

// HF Llama RMSNorm: normalize in fp32, cast back to x's dtype, then scale: w * norm(x).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// Rotary tables for positions [S] (float) and head_dim hd, rotate-half convention:
// returns {cos, sin}, each [S, hd] in fp32.
std::pair<at::Tensor, at::Tensor> rope_tables(const at::Tensor& positions, int64_t head_dim, double theta);

// x [..., S, heads, hd] * cos + rotate_half(x) * sin, with cos/sin [S, hd] cast to x's dtype.
at::Tensor apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// SwiGLU MLP: w2(silu(w1 x) * w3 x).
at::Tensor swiglu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3, const at::Tensor& w2);

}  // namespace mmtrain
