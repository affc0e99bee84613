#include "quant/dequantize_rows_cpu.h"

#include "core/error.h"
#include "quant/nf4.h"
#include "quant/quantized_rows.h"
#include "quant/rowwise.h"
#ifdef MMTRAIN_NATIVE_KERNELS
#include "quant/dequantize_rows_simd.h"
#endif

#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/bit_cast.h>

#include <array>
#include <cstring>

namespace mmtrain::quant {
namespace {

// The fp32 value of each int8 or fp8 code.
std::array<float, 256> code_values(BaseQuant kind) {
  std::array<float, 256> value{};
  for (int c = 0; c < 256; ++c) {
    const uint8_t byte = static_cast<uint8_t>(c);
    value[c] = kind == BaseQuant::int8 ? static_cast<float>(static_cast<int8_t>(byte))
                                       : static_cast<float>(c10::bit_cast<c10::Float8_e4m3fn>(byte));
  }
  return value;
}

float scale_at(const uint8_t* at) {
  float scale;
  std::memcpy(&scale, at, 4);  // scales follow the codes, unaligned
  return scale;
}

// The portable loop over rows [r0, r1): nf4 bytes through a table of their two levels, 8-bit codes
// through `value`, from column `first` (the vector loops leave an 8-bit row's last in % width
// columns here; nf4 rows are whole blocks, first == 0).
template <typename Public, typename Out>
void table_rows(const uint8_t* rows, int64_t r0, int64_t r1, int64_t in, BaseQuant kind,
                const std::array<float, 256>& value, int64_t first, Out* out) {
  const int64_t row_bytes = quantized_row_bytes(kind, in);
  auto put = [](float product) { return static_cast<Out>(static_cast<Public>(product)); };
  if (kind == BaseQuant::nf4) {
    const auto& level = nf4_levels();
    std::array<std::array<float, 2>, 256> pair;
    for (int b = 0; b < 256; ++b) pair[b] = {level[b >> 4], level[b & 15]};
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* codes = rows + r * row_bytes;
      Out* o = out + r * in;
      for (int64_t b = 0; b < in / kNf4Blocksize; ++b) {
        const float scale = scale_at(codes + in / 2 + 4 * b);
        for (int64_t i = 0; i < kNf4Blocksize / 2; ++i) {
          const auto& two = pair[codes[b * kNf4Blocksize / 2 + i]];
          o[b * kNf4Blocksize + 2 * i] = put(two[0] * scale);
          o[b * kNf4Blocksize + 2 * i + 1] = put(two[1] * scale);
        }
      }
    }
    return;
  }
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* codes = rows + r * row_bytes;
    const float scale = scale_at(codes + in);
    Out* o = out + r * in;
    if (kind == BaseQuant::int8)
      for (int64_t i = first; i < in; ++i) o[i] = put(value[codes[i]] * scale * kInt8Step);
    else
      for (int64_t i = first; i < in; ++i) o[i] = put(value[codes[i]] * scale);
  }
}

#ifdef MMTRAIN_NATIVE_KERNELS
// Rows [r0, r1) by a vector loop; returns the columns of each row it wrote (the rest: table_rows).
int64_t vector_rows(CpuDequantizer loop, const uint8_t* rows, int64_t r0, int64_t r1, int64_t in, BaseQuant kind,
                    simd::Store store, void* out_rows) {
  const uint8_t* first_row = rows + r0 * quantized_row_bytes(kind, in);
  const int64_t R = r1 - r0;
  const bool wide = loop == CpuDequantizer::avx512;
  switch (kind) {
    case BaseQuant::nf4:
      (wide ? simd::nf4_rows_avx512 : simd::nf4_rows_avx2)(first_row, R, in, nf4_levels().data(), store, out_rows);
      return in;
    case BaseQuant::int8:
      return (wide ? simd::int8_rows_avx512 : simd::int8_rows_avx2)(first_row, R, in, kInt8Step, store, out_rows);
    case BaseQuant::fp8_e4m3:
      return (wide ? simd::fp8_rows_avx512 : simd::fp8_rows_avx2)(first_row, R, in, store, out_rows);
    case BaseQuant::none: break;
  }
  fail("dequantize_rows_cpu: no format (base_quant none)");
}
#endif

template <typename Public, typename Out>
void dequantize_into(const uint8_t* rows, int64_t R, int64_t in, BaseQuant kind, [[maybe_unused]] CpuDequantizer loop,
                     Out* out) {
  const std::array<float, 256> value = kind == BaseQuant::nf4 ? std::array<float, 256>{} : code_values(kind);
  at::parallel_for(0, R, 1, [&](int64_t r0, int64_t r1) {
    int64_t done = 0;
#ifdef MMTRAIN_NATIVE_KERNELS
    if (loop != CpuDequantizer::table) {
      const simd::Store store = std::is_same_v<Out, at::BFloat16> ? simd::Store::bf16
                                : std::is_same_v<Public, at::BFloat16> ? simd::Store::bf16_in_fp32
                                                                       : simd::Store::fp32;
      done = vector_rows(loop, rows, r0, r1, in, kind, store, out + r0 * in);
    }
#endif
    if (done < in) table_rows<Public>(rows, r0, r1, in, kind, value, done, out);
  });
}

}  // namespace

const char* cpu_dequantizer_name(CpuDequantizer loop) {
  switch (loop) {
    case CpuDequantizer::table: return "table";
    case CpuDequantizer::avx2: return "avx2";
    case CpuDequantizer::avx512: return "avx512";
  }
  return "?";
}

bool cpu_dequantizer_available(CpuDequantizer loop) {
#ifdef MMTRAIN_NATIVE_KERNELS
  static const bool avx2 = simd::avx2_available(), avx512 = simd::avx512_available();
  if (loop == CpuDequantizer::avx2) return avx2;
  if (loop == CpuDequantizer::avx512) return avx512;
#endif
  return loop == CpuDequantizer::table;
}

CpuDequantizer fastest_cpu_dequantizer() {
  for (CpuDequantizer loop : {CpuDequantizer::avx512, CpuDequantizer::avx2})
    if (cpu_dequantizer_available(loop)) return loop;
  return CpuDequantizer::table;
}

void dequantize_rows_cpu(const at::Tensor& rows, BaseQuant kind, int64_t in, at::ScalarType public_dtype,
                         at::Tensor& out, CpuDequantizer loop) {
  const int64_t R = rows.size(0);
  if (!cpu_dequantizer_available(loop))
    fail("dequantize_rows_cpu: the ", cpu_dequantizer_name(loop), " loop is not in this build or on this CPU");
  if (!rows.device().is_cpu() || !rows.is_contiguous() || rows.scalar_type() != at::kByte || rows.dim() != 2 ||
      rows.size(1) != quantized_row_bytes(kind, in))
    fail("dequantize_rows_cpu: expected contiguous CPU uint8 [R, ", quantized_row_bytes(kind, in), "] ",
         base_quant_name(kind), " rows, got ", rows.scalar_type(), " ", rows.sizes(), " on ", rows.device());
  if (!out.device().is_cpu() || !out.is_contiguous() || out.dim() != 2 || out.size(0) != R || out.size(1) != in)
    fail("dequantize_rows_cpu: expected a contiguous CPU output [", R, ", ", in, "], got ", out.sizes());
  const uint8_t* data = rows.const_data_ptr<uint8_t>();
  auto into = [&](auto public_value) {
    using Public = decltype(public_value);
    switch (out.scalar_type()) {
      case at::kFloat: return dequantize_into<Public>(data, R, in, kind, loop, out.data_ptr<float>());
      case at::kBFloat16: return dequantize_into<Public>(data, R, in, kind, loop, out.data_ptr<at::BFloat16>());
      default: fail("dequantize_rows_cpu: the output must be fp32 or bf16, got ", out.scalar_type());
    }
  };
  switch (public_dtype) {
    case at::kFloat: return into(float{});
    case at::kBFloat16: return into(at::BFloat16{});
    default: fail("dequantize_rows_cpu: the public dtype must be fp32 or bf16, got ", public_dtype);
  }
}

}  // namespace mmtrain::quant
