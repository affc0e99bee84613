// first_non_finite against a plain loop: NaN and both infinities at chunk edges, fp32 fast path
// and the ATen path (bf16, a strided view), and non-float tensors.
#include "core/finite.h"

#include <gtest/gtest.h>

#include <limits>

namespace mmtrain {
namespace {

int64_t naive_first(const at::Tensor& t) {
  const auto flat = t.to(at::kDouble).contiguous().reshape(-1);
  for (int64_t i = 0; i < flat.numel(); ++i)
    if (!std::isfinite(flat[i].item<double>())) return i;
  return -1;
}

TEST(FirstNonFinite, FindsTheFirstBadElementAtEveryPosition) {
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity()};
  for (const int64_t n : {1, 7, 4096, 4097, 10000})
    for (const int64_t at : {int64_t{0}, n / 2, n - 1})
      for (const float bad : bad_values) {
        auto t = at::full({n}, 3.0e38f);  // large but finite: no false alarm
        t[at] = bad;
        if (at + 1 < n) t[n - 1] = bad;  // a later bad element does not hide the first
        EXPECT_EQ(first_non_finite(t), at) << n << " " << at << " " << bad;
        EXPECT_EQ(first_non_finite(t.to(at::kBFloat16)), naive_first(t.to(at::kBFloat16))) << n << " " << at;
      }
}

TEST(FirstNonFinite, AllFiniteAndNonFloatTensors) {
  EXPECT_EQ(first_non_finite(at::randn({5000})), -1);
  EXPECT_EQ(first_non_finite(at::full({3}, std::numeric_limits<float>::denorm_min())), -1);
  EXPECT_EQ(first_non_finite(at::arange(10)), -1);  // int64
  EXPECT_EQ(first_non_finite(at::Tensor()), -1);
  auto m = at::zeros({4, 6});
  m[2][1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(first_non_finite(m), 13);
  EXPECT_EQ(first_non_finite(m.t()), naive_first(m.t()));  // strided: ATen's path, row-major order of the view
}

}  // namespace
}  // namespace mmtrain
