// NF4 with double-quantized absmax: bitsandbytes' 4-bit format, the one peft's QLoRA and the
// `-bnb-4bit` HF checkpoints store (bitsandbytes.functional.quantize_4bit with blocksize 64,
// quant_type "nf4", compress_statistics). docs/qlora.md writes it down:
//
//   blocks of 64 elements of the flat weight (the last may be shorter), absmax_b = max |x| (fp32);
//   v = clamp(x * (1 / max(absmax_b, 1e-38)), -1, 1) (x / max(...) in a short last block), its
//   code the number of NF4 midpoints (level_k + level_{k+1}) / 2 below v (a tie goes to the lower
//   level); codes packed two a byte,
//   element 2i in the high nibble (an odd count is padded with the code of 0.0);
//   offset = mean(absmax) (torch's fp32 mean); absmax_b - offset quantized by the 8-bit dynamic
//   map in blocks of 256 (quant/dynamic_map.h).
//   Dequantized: level[code] * (map[absmax_code] * nested_absmax + offset), each product fp32,
//   then rounded once to the public dtype.
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <vector>

namespace mmtrain::quant {

inline constexpr int64_t kNf4Blocksize = 64;
inline constexpr int64_t kNf4NestedBlocksize = 256;

// The 16 NF4 levels (QLoRA, Dettmers et al. 2023, appendix E), ascending.
const std::array<float, 16>& nf4_levels();
// The same as fp32 [16] on the CPU (bitsandbytes' quant_map).
at::Tensor nf4_levels_tensor();

struct Nf4Weight {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kBFloat16;  // the public dtype it dequantizes to
  at::Tensor packed;         // uint8 [ceil(n / 2)]
  at::Tensor absmax_codes;   // uint8 [blocks]: absmax_b - offset, 8-bit dynamic
  at::Tensor nested_absmax;  // fp32 [ceil(blocks / 256)]
  float offset = 0;

  int64_t numel() const;
  int64_t blocks() const { return (numel() + kNf4Blocksize - 1) / kNf4Blocksize; }
  // Fails naming `what` when the tensors' sizes do not match the shape (a hostile checkpoint), or
  // a scale is NaN or Inf.
  void check(const std::string& what) const;
};

// weight: any float dtype and shape, on the CPU.
Nf4Weight quantize_nf4(const at::Tensor& weight);
// Each block's absmax, fp32 [blocks].
at::Tensor nf4_block_absmax(const Nf4Weight& q);
// The weight in `dtype` (its shape).
at::Tensor dequantize_nf4(const Nf4Weight& q, at::ScalarType dtype);

}  // namespace mmtrain::quant
