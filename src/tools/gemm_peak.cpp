#include "tools/gemm_peak.h"

#include "core/error.h"
#include "tools/command.h"

#include <ATen/Parallel.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <vector>

namespace mmtrain {

GemmPeak measure_gemm_peak(int64_t size, at::ScalarType dtype, int threads, int repeats) {
  if (size < 16 || repeats < 1 || threads < 1)
    fail("measure gemm: need size >= 16, repeats >= 1, threads >= 1; got ", size, ", ", repeats, ", ", threads);
  at::set_num_threads(threads);
  auto a = at::randn({size, size}).to(dtype), b = at::randn({size, size}).to(dtype);
  auto c = at::mm(a, b);  // warm-up: first call pays for packing buffers and thread start
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(seconds.begin(), seconds.begin() + seconds.size() / 2, seconds.end());
  GemmPeak peak;
  peak.flops_per_second = 2.0 * size * size * size / seconds[seconds.size() / 2];
  peak.size = size;
  peak.threads = threads;
  peak.dtype = dtype;
  return peak;
}

void add_measure_commands(CLI::App& app, Commands& commands) {
  struct Args {
    int64_t size = 1024;
    int threads = 1, repeats = 10;
    std::string dtype = "fp32";
  };
  auto o = std::make_shared<Args>();
  auto* measure = app.add_subcommand("measure", "measure this machine");
  measure->require_subcommand(1);
  auto* gemm = measure->add_subcommand("gemm", "GEMM FLOP/s reached here (the CPU stand-in for a peak, for MFU)");
  gemm->add_option("--size", o->size, "square matrix size")->capture_default_str();
  gemm->add_option("--threads", o->threads, "intra-op threads (a torchrun rank here uses OMP_NUM_THREADS)")
      ->capture_default_str();
  gemm->add_option("--repeats", o->repeats, "timed repeats (the median is reported)")->capture_default_str();
  gemm->add_option("--dtype", o->dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  commands.add(gemm, [o] {
    const auto peak = measure_gemm_peak(o->size, o->dtype == "bf16" ? at::kBFloat16 : at::kFloat, o->threads, o->repeats);
    std::printf("{\"gemm_flops\": %.6g, \"size\": %lld, \"threads\": %d, \"dtype\": \"%s\"}\n",
                peak.flops_per_second, static_cast<long long>(peak.size), peak.threads, o->dtype.c_str());
  });
}

}  // namespace mmtrain
