// bitsandbytes' 8-bit blockwise quantization over its dynamic maps: how QLoRA stores the NF4
// blocks' absmax (double quantization, `compress_statistics`, signed map) and how the 8-bit AdamW
// stores its moments (optim/adamw8bit.h: exp_avg on the signed map, exp_avg_sq on the unsigned
// one). Written from bitsandbytes 0.50 (functional.create_dynamic_map, csrc/cpu_ops.cpp
// quantize_cpu_impl); docs/qlora.md, docs/optimizer.md.
//
// The maps: 256 sorted fp32 values. Signed, in [-1, 1]: for i = 0..6, m_i = the midpoints of
// linspace(0.1, 1, 2^i + 1) (fp32), scaled by fp32(10^(i - 6)), with both signs; then 0 and 1.
// Unsigned, in [0, 1]: the midpoints of linspace(0.1, 1, 2^(i+1) + 1), positive only; then 0
// and 1. Quantizing a block of `blocksize` values: absmax = max |x| (0: every code 0); v =
// clamp(x * (1 / absmax), -1, 1); the code is lut[uint16((v + 1) * 0.5 * 65535 + 0.5)], where
// lut[j] is the first map entry whose upper midpoint (map[k] + map[k + 1]) / 2 is not below
// -1 + 2j / 65535: the nearest entry, up to the 65536-cell grid (exactly what bitsandbytes' CPU
// kernel stores, for either map). Dequantizing: map[code] * absmax, in fp32.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace mmtrain::quant {

enum class DynamicMap {
  signed_values,    // bitsandbytes' "dynamic": create_dynamic_map(signed=True)
  unsigned_values,  // its "udynamic": create_dynamic_map(signed=False), for values >= 0
};

// fp32 [256], ascending.
const at::Tensor& dynamic_map(DynamicMap map = DynamicMap::signed_values);

struct Blockwise8 {
  at::Tensor codes;   // uint8 [n]
  at::Tensor absmax;  // fp32 [ceil(n / blocksize)]
};

// values: fp32, contiguous, any shape (read flat).
Blockwise8 quantize_blockwise8(const at::Tensor& values, int64_t blocksize, DynamicMap map = DynamicMap::signed_values);
// -> fp32 [n]
at::Tensor dequantize_blockwise8(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize,
                                 DynamicMap map = DynamicMap::signed_values);

// One block's pieces, for callers that keep their blocks themselves (a block split across FSDP
// shards: optim/adamw8bit.h). max |values[0, n)|.
float block_absmax(const float* values, int64_t n);
// codes[0, n) of values[0, n) in a block of that absmax (0: every code 0).
void quantize_block(const float* values, int64_t n, float absmax, DynamicMap map, uint8_t* codes);
// values[0, n) = map[codes[i]] * absmax.
void dequantize_block(const uint8_t* codes, int64_t n, float absmax, DynamicMap map, float* values);

}  // namespace mmtrain::quant
