#include "planning/gemm_peak.h"

#include "core/device_sync.h"
#include "core/error.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <vector>

namespace mmtrain {

GemmPeak measure_gemm_peak(int64_t size, at::ScalarType dtype, int threads, int repeats, at::Device device) {
  if (size < 16 || repeats < 1 || threads < 1)
    fail("measure gemm: need size >= 16, repeats >= 1, threads >= 1; got ", size, ", ", repeats, ", ", threads);
  at::set_num_threads(threads);
  auto a = at::randn({size, size}).to(device, dtype), b = at::randn({size, size}).to(device, dtype);
  auto c = at::mm(a, b);  // warm-up: first call pays for packing buffers, thread start, kernel choice
  synchronize_device(device);
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    synchronize_device(device);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  GemmPeak peak;
  peak.flops_per_second = 2.0 * size * size * size / seconds[seconds.size() / 2];
  peak.size = size;
  peak.threads = threads;
  peak.dtype = dtype;
  peak.device = device;
  return peak;
}

}  // namespace mmtrain
