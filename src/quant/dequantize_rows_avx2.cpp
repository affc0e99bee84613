#include "quant/dequantize_rows_simd.h"

#include <immintrin.h>

#include <cstring>

namespace mmtrain::quant::simd {
namespace {

constexpr int64_t kWidth = 8;  // floats a vector

// 8 products -> out[at, at + 8) as `S` says (dequantize_rows_simd.h).
template <Store S>
inline void store(__m256 p, void* out, int64_t at) {
  if constexpr (S == Store::fp32) {
    _mm256_storeu_ps(static_cast<float*>(out) + at, p);
  } else {
    const __m256i bits = _mm256_castps_si256(p);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i sum = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
    const __m256i rounded = _mm256_castps_si256(_mm256_blendv_ps(
        _mm256_castsi256_ps(sum), _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000)), _mm256_cmp_ps(p, p, _CMP_UNORD_Q)));
    if constexpr (S == Store::bf16) {
      const __m256i high = _mm256_srli_epi32(rounded, 16);
      // packus works per 128-bit lane: [h0-3, h0-3 | h4-7, h4-7]; qwords 0 and 2 are h0-7.
      const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(high, high), 0b1000);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(out) + at), _mm256_castsi256_si128(packed));
    } else {
      _mm256_storeu_ps(static_cast<float*>(out) + at,
                       _mm256_castsi256_ps(_mm256_and_si256(rounded, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)))));
    }
  }
}

float row_scale(const uint8_t* at) {
  float scale;
  std::memcpy(&scale, at, 4);  // scales follow the codes, unaligned
  return scale;
}

// 8 nf4 codes -> their levels: a permute within each half of the 16 levels, the half chosen by
// the code's bit 3 (moved to the sign bit for blendv).
inline __m256 nf4_levels_of(__m256i code, __m256 lower, __m256 upper) {
  return _mm256_blendv_ps(_mm256_permutevar8x32_ps(lower, code), _mm256_permutevar8x32_ps(upper, code),
                          _mm256_castsi256_ps(_mm256_slli_epi32(code, 28)));
}

// As the AVX-512 loop: a 64-element block a step, its nibbles interleaved back into element order
// (unpacklo: elements 0-15 and 32-47, unpackhi: 16-31 and 48-63), 8 codes at a time.
template <Store S>
void nf4_rows(const uint8_t* rows, int64_t R, int64_t in, const float* levels16, void* out) {
  const __m256 lower = _mm256_loadu_ps(levels16), upper = _mm256_loadu_ps(levels16 + 8);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int64_t blocks = in / 64, row_bytes = in / 2 + 4 * blocks;
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* codes = rows + r * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const __m256 scale = _mm256_set1_ps(row_scale(codes + in / 2 + 4 * b));
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * b));
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
      const __m256i low = _mm256_and_si256(bytes, nibble);
      const __m256i first = _mm256_unpacklo_epi8(high, low), second = _mm256_unpackhi_epi8(high, low);
      const __m128i groups[4] = {_mm256_castsi256_si128(first), _mm256_castsi256_si128(second),
                                 _mm256_extracti128_si256(first, 1), _mm256_extracti128_si256(second, 1)};
      for (int g = 0; g < 4; ++g)
        for (int half = 0; half < 2; ++half) {
          const __m128i eight = half == 0 ? groups[g] : _mm_srli_si128(groups[g], 8);
          const __m256 level = nf4_levels_of(_mm256_cvtepu8_epi32(eight), lower, upper);
          store<S>(_mm256_mul_ps(level, scale), out, r * in + 64 * b + 16 * g + kWidth * half);
        }
    }
  }
}

template <Store S>
int64_t int8_rows(const uint8_t* rows, int64_t R, int64_t in, float step, void* out) {
  const int64_t done = in / kWidth * kWidth;
  const __m256 step_v = _mm256_set1_ps(step);
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* codes = rows + r * (in + 4);
    const __m256 scale = _mm256_set1_ps(row_scale(codes + in));
    for (int64_t i = 0; i < done; i += kWidth) {
      const __m128i code = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
      const __m256 value = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(code));
      store<S>(_mm256_mul_ps(_mm256_mul_ps(value, scale), step_v), out, r * in + i);
    }
  }
  return done;
}

// 8 float8_e4m3fn codes (as int32) -> their fp32 values, exactly: a normal code's exponent rebiased
// (7 -> 127: + 120 << 23) with its 3 mantissa bits moved up, a subnormal one (exponent 0) as
// mantissa * 2^-9, the sign put back, 0x7F / 0xFF as NaN.
inline __m256 fp8_values(__m256i code) {
  const __m256i magnitude = _mm256_and_si256(code, _mm256_set1_epi32(0x7F));
  const __m256 normal = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(magnitude, 20), _mm256_set1_epi32(120 << 23)));
  const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), _mm256_set1_ps(1.0f / 512));
  __m256 value = _mm256_blendv_ps(normal, subnormal, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(8), magnitude)));
  value = _mm256_or_ps(value, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(code, _mm256_set1_epi32(0x80)), 24)));
  return _mm256_blendv_ps(value, _mm256_set1_ps(__builtin_nanf("")),
                          _mm256_castsi256_ps(_mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7F))));
}

template <Store S>
int64_t fp8_rows(const uint8_t* rows, int64_t R, int64_t in, void* out) {
  const int64_t done = in / kWidth * kWidth;
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* codes = rows + r * (in + 4);
    const __m256 scale = _mm256_set1_ps(row_scale(codes + in));
    for (int64_t i = 0; i < done; i += kWidth) {
      const __m256i code = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
      store<S>(_mm256_mul_ps(fp8_values(code), scale), out, r * in + i);
    }
  }
  return done;
}

}  // namespace

bool avx2_available() { return __builtin_cpu_supports("avx2"); }

void nf4_rows_avx2(const uint8_t* rows, int64_t R, int64_t in, const float* levels16, Store store, void* out) {
  with_store(store, [&]<Store S>() { nf4_rows<S>(rows, R, in, levels16, out); });
}

int64_t int8_rows_avx2(const uint8_t* rows, int64_t R, int64_t in, float step, Store store, void* out) {
  return with_store(store, [&]<Store S>() { return int8_rows<S>(rows, R, in, step, out); });
}

int64_t fp8_rows_avx2(const uint8_t* rows, int64_t R, int64_t in, Store store, void* out) {
  return with_store(store, [&]<Store S>() { return fp8_rows<S>(rows, R, in, out); });
}

}  // namespace mmtrain::quant::simd
