// The vector loops of the CPU dequantizer (quant/dequantize_rows_cpu.h), one file per instruction
// set: dequantize_rows_avx512.cpp and dequantize_rows_avx2.cpp are compiled with those flags and
// include no ATen or c10 header (an inline function of a shared header compiled there could be the
// copy the linker keeps for every other file); callers check *_available() first.
//
// Rows as quant/quantized_rows.h lays them out: nf4 rows are in / 2 packed bytes (element 2i the
// high nibble of byte i) then in / 64 fp32 block scales; int8 and fp8 rows are in codes then one
// fp32 scale. Each value is the fp32 product the table loop computes (level * scale; code * scale,
// times `step` for int8), then stored as `Store` says. bf16 rounding is to nearest even with every
// NaN stored as 0x7FC0, as c10::BFloat16 does.
#pragma once
#include <cstdint>

namespace mmtrain::quant::simd {

enum class Store : int {
  fp32,          // the product as it is (public dtype fp32, fp32 out)
  bf16_in_fp32,  // rounded to bf16, written widened to fp32 (public bf16, fp32 out)
  bf16,          // rounded to bf16, written as its 16 bits (bf16 out)
};

// Calls f.template operator()<S>() for the runtime `store` (each kernel's loops are templates
// over Store, so the choice is made once a call, not per vector).
template <typename F>
auto with_store(Store store, F&& f) {
  switch (store) {
    case Store::fp32: return f.template operator()<Store::fp32>();
    case Store::bf16_in_fp32: return f.template operator()<Store::bf16_in_fp32>();
    case Store::bf16: break;
  }
  return f.template operator()<Store::bf16>();
}

bool avx512_available();
bool avx2_available();

// Rows [R, row_bytes] -> out [R, in] (float or uint16_t bf16 bits as `store` says), in % 64 == 0.
void nf4_rows_avx512(const uint8_t* rows, int64_t R, int64_t in, const float* levels16, Store store, void* out);
void nf4_rows_avx2(const uint8_t* rows, int64_t R, int64_t in, const float* levels16, Store store, void* out);
// The first `done` = in rounded down to the vector width columns of each row; the caller writes
// the rest. int8 codes are converted (and scaled by `step`), fp8 codes decoded from their bits.
int64_t int8_rows_avx512(const uint8_t* rows, int64_t R, int64_t in, float step, Store store, void* out);
int64_t int8_rows_avx2(const uint8_t* rows, int64_t R, int64_t in, float step, Store store, void* out);
int64_t fp8_rows_avx512(const uint8_t* rows, int64_t R, int64_t in, Store store, void* out);
int64_t fp8_rows_avx2(const uint8_t* rows, int64_t R, int64_t in, Store store, void* out);

}  // namespace mmtrain::quant::simd
