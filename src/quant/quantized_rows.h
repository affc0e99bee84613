// A quantized frozen weight [out, in] as rows of bytes, each row its codes and then its scales, so
// that FSDP's dim-0 shards (fsdp/fully_shard.h) hold whole quantization blocks and move as bytes,
// and a row can follow the model's row layout (a re-laid gated MLP) with its scales. A stored row
// is `group` weight rows, the fewest whose elements are whole blocks (QuantizedRowShape):
//   nf4       group = 64 / gcd(in, 64), width = group * in elements: width / 2 bytes of packed
//             codes, then width / 64 fp32 block absmax (the double-quantized absmax expanded once,
//             on load: every block's scale exactly as dequantize_nf4 uses it); out % group == 0
//   int8      group 1: in int8 codes, then the fp32 SCB
//   fp8_e4m3  group 1: in float8_e4m3fn codes, then the fp32 scale
// A grouped row (nf4, in not a multiple of 64: MagiHuman's SwiGLU down_proj) keeps bitsandbytes'
// blocks, which run across weight rows; it cannot follow a re-laid row layout (refused where
// loading would need it).
// Dequantizing rows gives exactly what dequantize_weight gives for those rows (the same fp32
// products, rounded to the public dtype): on the CPU by the loops of quant/dequantize_rows_cpu.h,
// elsewhere (CUDA) by ATen ops.
#pragma once
#include "quant/quantized_weight.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace mmtrain::quant {

// How a weight [out, in] is stored: rows = out / group stored rows of width = group * in elements.
struct QuantizedRowShape {
  int64_t rows = 0, width = 0, group = 1;
};
// Whether a weight of `shape` can be stored as rows of whole blocks in `kind` (2-D, out a multiple
// of the group).
bool row_quantizable(BaseQuant kind, const std::vector<int64_t>& shape);
// Its stored rows; fails unless row_quantizable.
QuantizedRowShape quantized_row_shape(BaseQuant kind, const std::vector<int64_t>& shape);
// Bytes one stored row of `width` elements takes.
int64_t quantized_row_bytes(BaseQuant kind, int64_t width);
// uint8 [rows, row_bytes] on the CPU.
at::Tensor quantized_rows(const QuantizedWeight& q);
// rows: uint8 [R, row_bytes] on any device -> [R, width] in `dtype`, each value rounded once to
// public_dtype first (then cast: the dequantized public weight as the model computes with it).
at::Tensor dequantize_rows(const at::Tensor& rows, BaseQuant kind, int64_t width, at::ScalarType public_dtype,
                           at::ScalarType dtype);

}  // namespace mmtrain::quant
