// `mmtrain measure gemm`: the FLOP/s this machine's GEMM actually reaches (square matmuls,
// median of repeats) on the CPU or a GPU: the CPU stand-in for a datasheet peak when reporting
// MFU here, and on a GPU the measured peak beside the datasheet's.
#pragma once
#include <ATen/ATen.h>

namespace mmtrain {

struct GemmPeak {
  double flops_per_second = 0;  // median over repeats
  int64_t size = 0;
  int threads = 0;
  at::ScalarType dtype = at::kFloat;
  at::Device device = at::kCPU;
};

// threads: the CPU's intra-op threads (on a GPU, the host's only).
GemmPeak measure_gemm_peak(int64_t size, at::ScalarType dtype, int threads, int repeats, at::Device device = at::kCPU);

}  // namespace mmtrain
