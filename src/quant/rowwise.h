// The 8-bit frozen-base formats, one scale per output row (dim 0) of a 2-D weight [out, in]
// (docs/qlora.md):
//   int8: bitsandbytes' LLM.int8 storage (Int8Params: int8_vectorwise_quant of the fp16 weight),
//     SCB_r = max |fp16(w_r)| (fp32), q = round_half_even(fp16(w) * (127 / SCB_r)) as int8;
//     dequantized q * SCB_r * fp32(1/127) (bitsandbytes' int8_vectorwise_dequant). No outlier
//     decomposition (LLM.int8's threshold): the frozen base is dequantized before every matmul.
//     A zero row stores SCB 0 and codes 0.
//   fp8_e4m3: musubi-tuner's fp8_scaled, scale_r = max |w_r| / 448 (fp32; 1 for a zero row),
//     q = float8_e4m3fn(clamp(w / scale_r, -448, 448)) by torch's cast (round to nearest even);
//     dequantized fp32(q) * scale_r.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain::quant {

// int8's step: bitsandbytes' int8_vectorwise_dequant multiplies by fp32(1 / 127).
inline constexpr float kInt8Step = static_cast<float>(1.0 / 127.0);

struct RowwiseWeight {
  at::Tensor codes;   // int8 or float8_e4m3fn [out, in]
  at::Tensor scales;  // fp32 [out]: SCB (int8) or scale (fp8)
};

RowwiseWeight quantize_int8_rowwise(const at::Tensor& weight);
RowwiseWeight quantize_fp8_rowwise(const at::Tensor& weight);
// Either format back to `dtype`, rounded once from fp32.
at::Tensor dequantize_rowwise(const RowwiseWeight& q, at::ScalarType dtype);

}  // namespace mmtrain::quant
