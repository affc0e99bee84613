#include "nn/attention_rows_avx512.h"

#include <immintrin.h>

namespace mmtrain::attention_rows {
namespace {

// exp(x): x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact product), exp(r) by
// its Taylor polynomial to r^7 (error below 1e-8 relative), times 2^n.
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.0f / 5040);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 720));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// 16 floats -> 16 bf16 bit patterns, round to nearest even.
inline __m256i to_bf16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded, 16));
}

}  // namespace

bool avx512_available() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

void probs_and_grads_t(const float* st, const float* dpt, int64_t rows, int64_t cols, float scale, const float* lse,
                       const float* delta, uint16_t* pt, uint16_t* dst, int64_t ld_out) {
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t c = 0; c < cols; c += 16) {
    const __m512 vlse = _mm512_loadu_ps(lse + c), vdelta = _mm512_loadu_ps(delta + c);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t in = r * cols + c, out = r * ld_out + c;
      const __m512 prob = exp_ps(_mm512_fmsub_ps(_mm512_loadu_ps(st + in), vscale, vlse));
      const __m512 grad = _mm512_mul_ps(prob, _mm512_sub_ps(_mm512_loadu_ps(dpt + in), vdelta));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pt + out), to_bf16(prob));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + out), to_bf16(grad));
    }
  }
}

}  // namespace mmtrain::attention_rows
