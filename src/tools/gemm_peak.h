// `mmtrain measure gemm`: the FLOP/s this machine's GEMM actually reaches (square matmuls,
// median of repeats), the CPU stand-in for a datasheet peak when reporting MFU here.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain {

struct GemmPeak {
  double flops_per_second = 0;  // median over repeats
  int64_t size = 0;
  int threads = 0;
  at::ScalarType dtype = at::kFloat;
};

GemmPeak measure_gemm_peak(int64_t size, at::ScalarType dtype, int threads, int repeats);

}  // namespace mmtrain
