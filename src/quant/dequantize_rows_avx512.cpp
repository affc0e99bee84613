#include "quant/dequantize_rows_simd.h"

#include <immintrin.h>

#include <cstring>

namespace mmtrain::quant::simd {
namespace {

constexpr int64_t kWidth = 16;  // floats a vector

// 16 products -> out[at, at + 16) as `S` says (dequantize_rows_simd.h).
template <Store S>
inline void store(__m512 p, void* out, int64_t at) {
  if constexpr (S == Store::fp32) {
    _mm512_storeu_ps(static_cast<float*>(out) + at, p);
  } else {
    const __m512i bits = _mm512_castps_si512(p);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(p, p, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC00000));
    if constexpr (S == Store::bf16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(out) + at),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16)));
    else
      _mm512_storeu_ps(static_cast<float*>(out) + at,
                       _mm512_castsi512_ps(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)))));
  }
}

float row_scale(const uint8_t* at) {
  float scale;
  std::memcpy(&scale, at, 4);  // scales follow the codes, unaligned
  return scale;
}

// One 64-element block a step: its 32 bytes split into high and low nibbles, interleaved back
// into element order (per 128-bit lane: unpacklo holds elements 0-15 and 32-47, unpackhi 16-31 and
// 48-63), 16 codes at a time looked up among the 16 levels and scaled.
template <Store S>
void nf4_rows(const uint8_t* rows, int64_t R, int64_t in, const float* levels16, void* out) {
  const __m512 levels = _mm512_loadu_ps(levels16);
  const __m256i nibble = _mm256_set1_epi8(0x0F);
  const int64_t blocks = in / 64, row_bytes = in / 2 + 4 * blocks;
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* codes = rows + r * row_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const __m512 scale = _mm512_set1_ps(row_scale(codes + in / 2 + 4 * b));
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 32 * b));
      const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
      const __m256i low = _mm256_and_si256(bytes, nibble);
      const __m256i first = _mm256_unpacklo_epi8(high, low), second = _mm256_unpackhi_epi8(high, low);
      const __m128i groups[4] = {_mm256_castsi256_si128(first), _mm256_castsi256_si128(second),
                                 _mm256_extracti128_si256(first, 1), _mm256_extracti128_si256(second, 1)};
      for (int g = 0; g < 4; ++g) {
        const __m512 level = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(groups[g]), levels);
        store<S>(_mm512_mul_ps(level, scale), out, r * in + 64 * b + kWidth * g);
      }
    }
  }
}

template <Store S>
int64_t int8_rows(const uint8_t* rows, int64_t R, int64_t in, float step, void* out) {
  const int64_t done = in / kWidth * kWidth;
  const __m512 step_v = _mm512_set1_ps(step);
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* codes = rows + r * (in + 4);
    const __m512 scale = _mm512_set1_ps(row_scale(codes + in));
    for (int64_t i = 0; i < done; i += kWidth) {
      const __m128i code = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i));
      const __m512 value = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(code));
      store<S>(_mm512_mul_ps(_mm512_mul_ps(value, scale), step_v), out, r * in + i);
    }
  }
  return done;
}

// 16 float8_e4m3fn codes (as int32) -> their fp32 values, exactly: a normal code's exponent
// rebiased (7 -> 127: + 120 << 23) with its 3 mantissa bits moved up, a subnormal one (exponent 0)
// as mantissa * 2^-9, the sign put back, 0x7F / 0xFF as NaN.
inline __m512 fp8_values(__m512i code) {
  const __m512i magnitude = _mm512_and_si512(code, _mm512_set1_epi32(0x7F));
  __m512 value = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(magnitude, 20), _mm512_set1_epi32(120 << 23)));
  value = _mm512_mask_mov_ps(value, _mm512_cmplt_epi32_mask(magnitude, _mm512_set1_epi32(8)),
                             _mm512_mul_ps(_mm512_cvtepi32_ps(magnitude), _mm512_set1_ps(1.0f / 512)));
  value = _mm512_or_ps(value, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(0x80)), 24)));
  return _mm512_mask_mov_ps(value, _mm512_cmpeq_epi32_mask(magnitude, _mm512_set1_epi32(0x7F)),
                            _mm512_set1_ps(__builtin_nanf("")));
}

template <Store S>
int64_t fp8_rows(const uint8_t* rows, int64_t R, int64_t in, void* out) {
  const int64_t done = in / kWidth * kWidth;
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* codes = rows + r * (in + 4);
    const __m512 scale = _mm512_set1_ps(row_scale(codes + in));
    for (int64_t i = 0; i < done; i += kWidth) {
      const __m512i code = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
      store<S>(_mm512_mul_ps(fp8_values(code), scale), out, r * in + i);
    }
  }
  return done;
}

}  // namespace

bool avx512_available() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

void nf4_rows_avx512(const uint8_t* rows, int64_t R, int64_t in, const float* levels16, Store store, void* out) {
  with_store(store, [&]<Store S>() { nf4_rows<S>(rows, R, in, levels16, out); });
}

int64_t int8_rows_avx512(const uint8_t* rows, int64_t R, int64_t in, float step, Store store, void* out) {
  return with_store(store, [&]<Store S>() { return int8_rows<S>(rows, R, in, step, out); });
}

int64_t fp8_rows_avx512(const uint8_t* rows, int64_t R, int64_t in, Store store, void* out) {
  return with_store(store, [&]<Store S>() { return fp8_rows<S>(rows, R, in, out); });
}

}  // namespace mmtrain::quant::simd
