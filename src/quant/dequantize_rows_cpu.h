// Dequantizing quantized rows (quant/quantized_rows.h) on the CPU, straight into the output
// buffer, by one of three loops that write the same bits:
//   table   portable: a 256-entry table per byte (nf4: its two levels; int8, fp8: the code's value)
//   avx2    8 values a vector (the nf4 levels by two permutes, fp8 decoded from its bits)
//   avx512  16 values a vector (the nf4 levels by one permute)
// Each value is the fp32 product ATen's path computes (quantized_rows.cpp), rounded once to the
// public dtype, then converted to the output's. The vector loops are built where the build has
// the native kernels (MMTRAIN_NATIVE_KERNELS, x86-64) and taken where the CPU has them.
#pragma once
#include "quant/base_quant.h"

#include <ATen/ATen.h>

namespace mmtrain::quant {

enum class CpuDequantizer { table, avx2, avx512 };

const char* cpu_dequantizer_name(CpuDequantizer loop);
// Built into this binary and supported by this CPU (table: always).
bool cpu_dequantizer_available(CpuDequantizer loop);
// The widest available: the one dequantize_rows uses.
CpuDequantizer fastest_cpu_dequantizer();

// rows: contiguous uint8 [R, quantized_row_bytes(kind, in)] on the CPU; out: contiguous [R, in],
// fp32 or bf16; public_dtype fp32 or bf16. Rows in parallel (at::parallel_for).
void dequantize_rows_cpu(const at::Tensor& rows, BaseQuant kind, int64_t in, at::ScalarType public_dtype,
                         at::Tensor& out, CpuDequantizer loop);

}  // namespace mmtrain::quant
