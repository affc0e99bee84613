// bitsandbytes' 8-bit blockwise quantization with its signed dynamic map: how QLoRA stores the
// NF4 blocks' absmax (double quantization, `compress_statistics`). Written from bitsandbytes
// 0.50 (functional.create_dynamic_map, csrc/cpu_ops.cpp quantize_cpu_impl); docs/qlora.md.
//
// The map: 256 sorted fp32 values in [-1, 1]: for i = 0..6, m_i = the midpoints of
// linspace(0.1, 1, 2^i + 1) (fp32), scaled by fp32(10^(i - 6)), with both signs; then 0 and 1.
// Quantizing a block of `blocksize` values: absmax = max |x| (0: every code 0); v = clamp(x *
// (1 / absmax), -1, 1); the code is lut[uint16((v + 1) * 0.5 * 65535 + 0.5)], where lut[j] is the
// first map entry whose upper midpoint (map[k] + map[k + 1]) / 2 is not below
// -1 + 2j / 65535: the nearest entry, up to the 65536-cell grid (exactly what bitsandbytes'
// CPU kernel stores). Dequantizing: map[code] * absmax, in fp32.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mmtrain::quant {

// fp32 [256], ascending.
const at::Tensor& dynamic_map();

struct Blockwise8 {
  at::Tensor codes;   // uint8 [n]
  at::Tensor absmax;  // fp32 [ceil(n / blocksize)]
};

// values: fp32, contiguous, any shape (read flat).
Blockwise8 quantize_blockwise8(const at::Tensor& values, int64_t blocksize);
// -> fp32 [n]
at::Tensor dequantize_blockwise8(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize);

}  // namespace mmtrain::quant
