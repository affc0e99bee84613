#include "core/finite.h"

#include <algorithm>
#include <cstring>

namespace mmtrain {
namespace {

// fp32 bits with every exponent bit set are NaN or ±Inf.
constexpr uint32_t kExponentBits = 0x7f800000u;
constexpr int64_t kChunk = 4096;

int64_t first_non_finite_fp32(const float* data, int64_t n) {
  for (int64_t begin = 0; begin < n; begin += kChunk) {
    const int64_t end = std::min(n, begin + kChunk);
    // Branch-free over the chunk, so that the compiler vectorizes it; search the chunk only
    // when it holds a bad element.
    uint32_t any_bad = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, data + i, sizeof bits);
      any_bad |= static_cast<uint32_t>((bits & kExponentBits) == kExponentBits);
    }
    if (!any_bad) continue;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, data + i, sizeof bits);
      if ((bits & kExponentBits) == kExponentBits) return i;
    }
  }
  return -1;
}

}  // namespace

int64_t first_non_finite(const at::Tensor& t) {
  if (!t.defined() || !at::isFloatingType(t.scalar_type()) || t.numel() == 0) return -1;
  if (t.is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous())
    return first_non_finite_fp32(t.const_data_ptr<float>(), t.numel());
  const auto bad = at::logical_not(at::isfinite(t)).reshape(-1);
  if (!bad.any().item<bool>()) return -1;
  return bad.nonzero().select(1, 0)[0].item<int64_t>();
}

}  // namespace mmtrain
