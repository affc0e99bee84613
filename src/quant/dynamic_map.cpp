#include "quant/dynamic_map.h"

#include "core/error.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

namespace mmtrain::quant {
namespace {

constexpr int kMapSize = 256;
constexpr int kGridCells = 65536;

at::Tensor make_dynamic_map(DynamicMap kind) {
  constexpr int kExponents = 7;
  const bool is_signed = kind == DynamicMap::signed_values;
  std::vector<float> values;
  for (int i = 0; i < kExponents; ++i) {
    // at::linspace is torch's own: the same fp32 boundaries bitsandbytes builds. The unsigned map
    // spends the sign bit on twice the fractions.
    const int64_t fractions = (int64_t{1} << (is_signed ? i : i + 1)) + 1;
    const at::Tensor boundaries = at::linspace(0.1, 1.0, fractions, at::kFloat);
    const at::Tensor means = ((boundaries.narrow(0, 0, fractions - 1) + boundaries.narrow(0, 1, fractions - 1)) / 2.0)
                                 .contiguous();
    const float scale = static_cast<float>(std::pow(10.0, i - (kExponents - 1)));
    const float* m = means.data_ptr<float>();
    for (int64_t k = 0; k < means.numel(); ++k) values.push_back(scale * m[k]);
    if (is_signed)
      for (int64_t k = 0; k < means.numel(); ++k) values.push_back(-scale * m[k]);
  }
  values.push_back(0.0f);
  values.push_back(1.0f);
  if (static_cast<int>(values.size()) != kMapSize) fail("dynamic map: ", values.size(), " values, expected 256");
  std::sort(values.begin(), values.end());
  return at::tensor(values, at::kFloat);
}

// lut[j]: the map entry a value in grid cell j quantizes to.
std::array<uint8_t, kGridCells> make_grid(const at::Tensor& map) {
  const float* code = map.data_ptr<float>();
  std::array<float, kMapSize - 1> midpoints;
  for (int k = 0; k < kMapSize - 1; ++k) midpoints[k] = 0.5f * (code[k] + code[k + 1]);
  std::array<uint8_t, kGridCells> grid;
  int k = 0;
  for (int j = 0; j < kGridCells; ++j) {
    const float value = -1.0f + (2.0f * static_cast<float>(j)) / static_cast<float>(kGridCells - 1);
    while (k < kMapSize - 1 && midpoints[k] < value) ++k;
    grid[j] = static_cast<uint8_t>(k);
  }
  return grid;
}

const std::array<uint8_t, kGridCells>& grid(DynamicMap map) {
  static const std::array<uint8_t, kGridCells> signed_grid = make_grid(dynamic_map(DynamicMap::signed_values));
  static const std::array<uint8_t, kGridCells> unsigned_grid = make_grid(dynamic_map(DynamicMap::unsigned_values));
  return map == DynamicMap::signed_values ? signed_grid : unsigned_grid;
}

}  // namespace

const at::Tensor& dynamic_map(DynamicMap map) {
  static const at::Tensor signed_map = make_dynamic_map(DynamicMap::signed_values);
  static const at::Tensor unsigned_map = make_dynamic_map(DynamicMap::unsigned_values);
  return map == DynamicMap::signed_values ? signed_map : unsigned_map;
}

float block_absmax(const float* values, int64_t n) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(values[i]));
  return absmax;
}

void quantize_block(const float* values, int64_t n, float absmax, DynamicMap map, uint8_t* codes) {
  if (absmax == 0.0f) {
    std::fill(codes, codes + n, uint8_t{0});
    return;
  }
  const auto& lut = grid(map);
  const float inverse = 1.0f / absmax;
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::clamp(values[i] * inverse, -1.0f, 1.0f);
    const float cell = (v + 1.0f) * 0.5f * static_cast<float>(kGridCells - 1);
    codes[i] = lut[static_cast<uint16_t>(cell + 0.5f)];
  }
}

void dequantize_block(const uint8_t* codes, int64_t n, float absmax, DynamicMap map, float* values) {
  const float* code = dynamic_map(map).data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) values[i] = code[codes[i]] * absmax;
}

Blockwise8 quantize_blockwise8(const at::Tensor& values, int64_t blocksize, DynamicMap map) {
  if (values.scalar_type() != at::kFloat || !values.is_contiguous() || values.device().type() != at::kCPU)
    fail("quantize_blockwise8: expected contiguous fp32 CPU values, got ", values.scalar_type(), " on ", values.device());
  if (blocksize < 1) fail("quantize_blockwise8: blocksize must be >= 1, found ", blocksize);
  const int64_t n = values.numel(), blocks = (n + blocksize - 1) / blocksize;
  Blockwise8 out{at::empty({n}, at::kByte), at::empty({blocks}, at::kFloat)};
  const float* x = values.data_ptr<float>();
  uint8_t* codes = out.codes.data_ptr<uint8_t>();
  float* absmax = out.absmax.data_ptr<float>();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * blocksize, len = std::min(n, begin + blocksize) - begin;
    absmax[b] = block_absmax(x + begin, len);
    quantize_block(x + begin, len, absmax[b], map, codes + begin);
  }
  return out;
}

at::Tensor dequantize_blockwise8(const at::Tensor& codes, const at::Tensor& absmax, int64_t blocksize, DynamicMap map) {
  const int64_t n = codes.numel();
  if (codes.scalar_type() != at::kByte || absmax.scalar_type() != at::kFloat || blocksize < 1 ||
      absmax.numel() != (n + blocksize - 1) / blocksize)
    fail("dequantize_blockwise8: expected uint8 codes [n] and fp32 absmax [ceil(n / ", blocksize, ")], got ",
         codes.scalar_type(), " ", codes.sizes(), " and ", absmax.scalar_type(), " ", absmax.sizes());
  const at::Tensor values = dynamic_map(map).index_select(0, codes.reshape({-1}).to(at::kLong));
  const at::Tensor scales = absmax.repeat_interleave(blocksize).narrow(0, 0, n);
  return values * scales;
}

}  // namespace mmtrain::quant
