// Pillow-exact bicubic resampling of uint8 images; see pil_resize.h for the algorithm. The
// floating-point steps (centres, kernel weights, normalisation) are evaluated in the same order
// and precision as Resample.c so the 22-bit fixed-point weights come out identical.
#include "data/image/pil_resize.h"

#include "core/error.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace mmtrain::image {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Resample.c PRECISION_BITS: 8-bit result, 2 overflow bits

double bicubic_filter(double x) {  // Keys cubic convolution, a = -0.5 (Pillow's choice)
  constexpr double a = -0.5;
  if (x < 0.0) x = -x;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

// Per output index: the first source index and the count of taps, and ksize fixed-point weights
// (the unused tail is zero).
struct Coefficients {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> weights;  // [out_size, ksize]
};

Coefficients precompute_coefficients(int in_size, int out_size) {
  constexpr double kSupport = 2.0;
  // Pillow passes the box edges as floats (in0 = 0, in1 = in_size).
  const float in0 = 0.0f, in1 = static_cast<float>(in_size);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = kSupport * filterscale;
  Coefficients c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.resize(out_size);
  c.count.resize(out_size);
  c.weights.assign(static_cast<size_t>(out_size) * c.ksize, 0);
  std::vector<double> k(c.ksize);
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);  // truncation, as the C cast
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      const double w = bicubic_filter((x + xmin - center + 0.5) * ss);
      k[x] = w;
      ww += w;
    }
    for (int x = 0; x < xmax; ++x) {
      if (ww != 0.0) k[x] /= ww;
    }
    int32_t* fixed = c.weights.data() + static_cast<size_t>(xx) * c.ksize;
    for (int x = 0; x < xmax; ++x) {
      const double scaled = k[x] * (1 << kPrecisionBits);
      fixed[x] = static_cast<int32_t>(k[x] < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    c.first[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

inline uint8_t clip8(int64_t acc) {
  const int64_t v = acc >> kPrecisionBits;  // arithmetic shift: floor, as Pillow's lookup index
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// out[y, xx, ch] = sum_x in[y + row_offset, first[xx] + x, ch] * w[xx, x], for y < out rows.
void resample_horizontal(const uint8_t* in, int64_t in_width, int64_t channels, int64_t row_offset,
                         const Coefficients& c, uint8_t* out, int64_t out_rows, int64_t out_width) {
  at::parallel_for(0, out_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t y = begin; y < end; ++y) {
      const uint8_t* src = in + (y + row_offset) * in_width * channels;
      uint8_t* dst = out + y * out_width * channels;
      for (int64_t xx = 0; xx < out_width; ++xx) {
        const int32_t* w = c.weights.data() + xx * c.ksize;
        const uint8_t* s = src + static_cast<int64_t>(c.first[xx]) * channels;
        for (int64_t ch = 0; ch < channels; ++ch) {
          int64_t acc = int64_t{1} << (kPrecisionBits - 1);  // +0.5 for rounding
          for (int x = 0; x < c.count[xx]; ++x) acc += static_cast<int64_t>(s[x * channels + ch]) * w[x];
          dst[xx * channels + ch] = clip8(acc);
        }
      }
    }
  });
}

// out[yy, x, ch] = sum_y in[first[yy] - row_offset + y, x, ch] * w[yy, y].
void resample_vertical(const uint8_t* in, int64_t width, int64_t channels, int64_t row_offset,
                       const Coefficients& c, uint8_t* out, int64_t out_height) {
  const int64_t row = width * channels;
  at::parallel_for(0, out_height, 16, [&](int64_t begin, int64_t end) {
    for (int64_t yy = begin; yy < end; ++yy) {
      const int32_t* w = c.weights.data() + yy * c.ksize;
      const uint8_t* src = in + (c.first[yy] - row_offset) * row;
      uint8_t* dst = out + yy * row;
      for (int64_t i = 0; i < row; ++i) {
        int64_t acc = int64_t{1} << (kPrecisionBits - 1);
        for (int y = 0; y < c.count[yy]; ++y) acc += static_cast<int64_t>(src[y * row + i]) * w[y];
        dst[i] = clip8(acc);
      }
    }
  });
}

}  // namespace

at::Tensor resize_bicubic_pil(const at::Tensor& rgb, int64_t out_height, int64_t out_width, PillowPassOrder order) {
  if (rgb.dim() != 3 || rgb.scalar_type() != at::kByte)
    fail("resize_bicubic_pil: expected uint8 [H, W, C], found ", rgb.scalar_type(), " ", rgb.sizes());
  const int64_t in_height = rgb.size(0), in_width = rgb.size(1), channels = rgb.size(2);
  if (in_height < 1 || in_width < 1 || channels < 1)
    fail("resize_bicubic_pil: empty image ", rgb.sizes(), ", expected at least 1x1 pixels");
  if (out_height < 1 || out_width < 1)
    fail("resize_bicubic_pil: output size ", out_height, "x", out_width, " must be at least 1x1");
  constexpr int64_t kMaxSide = int64_t{1} << 24;  // keeps every index and weight product in range
  if (in_height > kMaxSide || in_width > kMaxSide || out_height > kMaxSide || out_width > kMaxSide)
    fail("resize_bicubic_pil: sides above ", kMaxSide, " are not supported (", in_height, "x", in_width, " -> ",
         out_height, "x", out_width, ")");
  auto src = rgb.contiguous();
  if (in_height == out_height && in_width == out_width) return src.clone();
  const bool need_horizontal = in_width != out_width, need_vertical = in_height != out_height;
  // Pillow 13: "if height is being scaled down more than twice the amount the width is, run the
  // vertical pass first"; Pillow <= 12 always ran the horizontal pass first. The uint8 rounding
  // between the passes makes the order visible in the output.
  const bool horizontal_first = order == PillowPassOrder::always_horizontal_first ||
                                !(in_height - out_height > 0 && in_height - out_height > (in_width - out_width) * 2);
  const auto vertical = precompute_coefficients(static_cast<int>(in_height), static_cast<int>(out_height));
  Coefficients horizontal;
  if (need_horizontal) horizontal = precompute_coefficients(static_cast<int>(in_width), static_cast<int>(out_width));

  if (horizontal_first) {
    at::Tensor current = src;
    int64_t row_offset = 0;  // source row held in row 0 of `current`
    if (need_horizontal) {
      // Only the source rows the vertical pass reads.
      const int64_t row_first = vertical.first.front();
      const int64_t row_last = vertical.first.back() + vertical.count.back();
      auto temp = at::empty({row_last - row_first, out_width, channels}, at::kByte);
      resample_horizontal(src.data_ptr<uint8_t>(), in_width, channels, row_first, horizontal,
                          temp.data_ptr<uint8_t>(), row_last - row_first, out_width);
      current = temp;
      row_offset = row_first;
    }
    if (!need_vertical) return current;
    auto out = at::empty({out_height, out_width, channels}, at::kByte);
    resample_vertical(current.data_ptr<uint8_t>(), out_width, channels, row_offset, vertical,
                      out.data_ptr<uint8_t>(), out_height);
    return out;
  }
  // Vertical first (need_vertical holds here: the height shrinks).
  auto temp = at::empty({out_height, in_width, channels}, at::kByte);
  resample_vertical(src.data_ptr<uint8_t>(), in_width, channels, 0, vertical, temp.data_ptr<uint8_t>(), out_height);
  if (!need_horizontal) return temp;
  auto out = at::empty({out_height, out_width, channels}, at::kByte);
  resample_horizontal(temp.data_ptr<uint8_t>(), in_width, channels, 0, horizontal, out.data_ptr<uint8_t>(),
                      out_height, out_width);
  return out;
}

}  // namespace mmtrain::image
