#include "quant/nf4.h"

#include "core/error.h"
#include "core/text.h"
#include "quant/dynamic_map.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

namespace mmtrain::quant {

const std::array<float, 16>& nf4_levels() {
  static const std::array<float, 16> levels = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
      1.0f};
  return levels;
}

at::Tensor nf4_levels_tensor() {
  const auto& levels = nf4_levels();
  return at::tensor(std::vector<float>(levels.begin(), levels.end()), at::kFloat);
}

int64_t Nf4Weight::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

void Nf4Weight::check(const std::string& what) const {
  for (const int64_t d : shape)
    if (d < 0) fail(what, ": nf4 shape ", shape_str(shape), " has a negative size");
  const int64_t n = numel();
  const int64_t nested = (blocks() + kNf4NestedBlocksize - 1) / kNf4NestedBlocksize;
  auto expect = [&](const at::Tensor& t, at::ScalarType type, int64_t count, const char* name) {
    if (!t.defined() || t.scalar_type() != type || t.numel() != count)
      fail(what, ": nf4 '", name, "' must be ", c10::toString(type), " with ", count, " elements for shape ",
           shape_str(shape), " (", blocks(), " blocks of ", kNf4Blocksize, "), found ",
           t.defined() ? std::string(c10::toString(t.scalar_type())) + " " + shape_str(t.sizes().vec()) : "none");
  };
  expect(packed, at::kByte, (n + 1) / 2, "weight");
  expect(absmax_codes, at::kByte, blocks(), "absmax");
  expect(nested_absmax, at::kFloat, nested, "nested_absmax");
  if (!std::isfinite(offset) || !at::isfinite(nested_absmax).all().item<bool>())
    fail(what, ": nf4 scales hold NaN or Inf (nested_absmax or nested_offset)");
}

Nf4Weight quantize_nf4(const at::Tensor& weight) {
  if (!at::isFloatingType(weight.scalar_type()) || weight.device().type() != at::kCPU)
    fail("quantize_nf4: expected a float CPU tensor, got ", weight.scalar_type(), " on ", weight.device());
  Nf4Weight q;
  q.shape = weight.sizes().vec();
  q.dtype = weight.scalar_type();
  const at::Tensor x = weight.reshape({-1}).to(at::kFloat).contiguous();
  if (!at::isfinite(x).all().item<bool>()) fail("quantize_nf4: the weight holds NaN or Inf");
  const int64_t n = x.numel(), blocks = q.blocks();
  const auto& level = nf4_levels();
  std::array<float, 15> midpoints;
  for (int k = 0; k < 15; ++k) midpoints[k] = (level[k] + level[k + 1]) / 2.0f;

  at::Tensor absmax = at::empty({blocks}, at::kFloat);
  q.packed = at::zeros({(n + 1) / 2}, at::kByte);
  const float* in = x.data_ptr<float>();
  float* block_max = absmax.data_ptr<float>();
  uint8_t* packed = q.packed.data_ptr<uint8_t>();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4Blocksize, end = std::min(n, begin + kNf4Blocksize);
    float m = 0.0f;
    for (int64_t i = begin; i < end; ++i) m = std::max(m, std::fabs(in[i]));
    block_max[b] = m;
    // bitsandbytes multiplies a full block by the reciprocal and divides the short last one.
    const float bounded = std::max(m, 1e-38f), inverse = 1.0f / bounded;
    const bool full = end - begin == kNf4Blocksize;
    for (int64_t i = begin; i < end; ++i) {
      const float v = std::clamp(full ? in[i] * inverse : in[i] / bounded, -1.0f, 1.0f);
      const uint8_t code = static_cast<uint8_t>(std::lower_bound(midpoints.begin(), midpoints.end(), v) - midpoints.begin());
      packed[i / 2] |= (i % 2 == 0) ? static_cast<uint8_t>(code << 4) : code;
    }
  }
  if (n % 2 == 1) packed[n / 2] |= 7;  // the pad element: the code of 0.0
  q.offset = absmax.mean().item<float>();
  const Blockwise8 nested = quantize_blockwise8((absmax - q.offset).contiguous(), kNf4NestedBlocksize);
  q.absmax_codes = nested.codes;
  q.nested_absmax = nested.absmax;
  return q;
}

at::Tensor nf4_block_absmax(const Nf4Weight& q) {
  return dequantize_blockwise8(q.absmax_codes, q.nested_absmax, kNf4NestedBlocksize) + q.offset;
}

at::Tensor dequantize_nf4(const Nf4Weight& q, at::ScalarType dtype) {
  const int64_t n = q.numel();
  const at::Tensor absmax = nf4_block_absmax(q).contiguous();
  at::Tensor out = at::empty({n}, at::kFloat);
  const auto& level = nf4_levels();
  const uint8_t* packed = q.packed.data_ptr<uint8_t>();
  const float* scale = absmax.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, (n + 1) / 2, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t byte = begin; byte < end; ++byte) {
      const int64_t i = 2 * byte;
      o[i] = level[packed[byte] >> 4] * scale[i / kNf4Blocksize];
      if (i + 1 < n) o[i + 1] = level[packed[byte] & 0x0F] * scale[(i + 1) / kNf4Blocksize];
    }
  });
  return out.to(dtype).reshape(q.shape);
}

}  // namespace mmtrain::quant
