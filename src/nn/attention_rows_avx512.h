// The elementwise part of the AMX attention backward (nn/attention_amx.h), in AVX-512: the pass
// over a tile of scores between its GEMMs. This file's .cpp is compiled with AVX-512 flags and
// includes no ATen or c10 header (an inline function of a shared header compiled here with
// AVX-512 could be the copy the linker keeps for every other file); callers check
// avx512_available() first.
//
// bf16 values travel as their uint16_t bit patterns, rounded to nearest even like c10::BFloat16.
// exp is computed to about 2 ulp (Cody-Waite reduction, degree-7 polynomial); arguments below
// -104 give 0.
#pragma once
#include <cstdint>

namespace mmtrain::attention_rows {

bool avx512_available();

// Backward, one tile with keys as rows and queries as columns (cols a multiple of 16; st and dpt
// with row stride cols): p = exp(scale * st - lse[col]), ds = p * (dpt - delta[col]). Writes p and
// ds as bf16 into pt and dst (row stride ld_out).
void probs_and_grads_t(const float* st, const float* dpt, int64_t rows, int64_t cols, float scale, const float* lse,
                       const float* delta, uint16_t* pt, uint16_t* dst, int64_t ld_out);

}  // namespace mmtrain::attention_rows
