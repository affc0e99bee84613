// A quantized frozen weight [out, in] as rows of bytes, each row its codes and then its scales, so
// that FSDP's dim-0 shards (fsdp/fully_shard.h) hold whole quantization blocks and move as bytes,
// and a row can follow the model's row layout (a re-laid gated MLP) with its scales:
//   nf4       in / 2 bytes of packed codes, then in / 64 fp32 block absmax (the double-quantized
//             absmax expanded once, on load: every block's scale exactly as dequantize_nf4 uses
//             it); needs in % 64 == 0
//   int8      in int8 codes, then the fp32 SCB
//   fp8_e4m3  in float8_e4m3fn codes, then the fp32 scale
// Dequantizing rows gives exactly what dequantize_weight gives for those rows (the same fp32
// products, rounded to the public dtype), with ATen ops on any device.
#pragma once
#include "quant/quantized_weight.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace mmtrain::quant {

// Whether a weight of `shape` can be stored as rows of whole blocks in `kind`.
bool row_quantizable(BaseQuant kind, const std::vector<int64_t>& shape);
// Bytes one row of `in` elements takes.
int64_t quantized_row_bytes(BaseQuant kind, int64_t in);
// uint8 [out, row_bytes] on the CPU.
at::Tensor quantized_rows(const QuantizedWeight& q);
// rows: uint8 [R, row_bytes] on any device -> [R, in] in `dtype`, each value rounded once to
// public_dtype first (then cast: the dequantized public weight as the model computes with it).
at::Tensor dequantize_rows(const at::Tensor& rows, BaseQuant kind, int64_t in, at::ScalarType public_dtype,
                           at::ScalarType dtype);

}  // namespace mmtrain::quant
