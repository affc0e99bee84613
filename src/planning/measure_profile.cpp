#include "planning/measure_profile.h"

#include "core/error.h"
#include "core/statistics.h"
#include "core/text.h"
#include "dist/comm.h"
#include "dist/runtime.h"
#include "io/user_file.h"
#include "offload/disk_store.h"
#include "plan/device_profile.h"
#include "planning/gemm_peak.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mmtrain {
namespace {

constexpr double kGB = 1e9;
constexpr int kRepeats = 5;

// Median seconds of `repeats` runs of fn, after one untimed run.
double median_seconds(const std::function<void()>& fn, int repeats = kRepeats) {
  fn();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return median(seconds);
}

// Attention forward + backward (non-causal: 4 S² d h forward, twice that backward) in FLOP/s.
double attention_flops_per_second() {
  constexpr int64_t heads = 8, seqlen = 1024, head_dim = 64;
  auto q = at::randn({1, heads, seqlen, head_dim}).to(at::kBFloat16).requires_grad_(true);
  auto k = at::randn({1, heads, seqlen, head_dim}).to(at::kBFloat16).requires_grad_(true);
  auto v = at::randn({1, heads, seqlen, head_dim}).to(at::kBFloat16).requires_grad_(true);
  const double seconds = median_seconds([&] {
    auto out = at::scaled_dot_product_attention(q, k, v);
    out.sum().backward();
  });
  return 3.0 * 4.0 * seqlen * seqlen * head_dim * heads / seconds;
}

double copy_gb_per_s(int64_t mb) {
  auto src = at::ones({mb * (1 << 20) / 4}), dst = at::empty_like(src);
  const double seconds = median_seconds([&] { dst.copy_(src); });
  return 2.0 * static_cast<double>(src.nbytes()) / seconds / kGB;  // read + write
}

// Bus bandwidth of a Gloo all-reduce between `ranks` thread ranks over loopback.
double allreduce_gb_per_s(int ranks, int64_t mb) {
  if (ranks < 2) fail("measure profile: --ranks must be >= 2 for the all-reduce, found ", ranks);
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<double> seconds(ranks);
  std::vector<std::thread> threads;
  std::exception_ptr error;
  std::mutex mutex;
  for (int rank = 0; rank < ranks; ++rank)
    threads.emplace_back([&, rank] {
      try {
        Comm comm(make_backend(store, rank, ranks, Device::cpu, std::chrono::seconds(120)), rank, ranks);
        auto t = at::ones({mb * (1 << 20) / 4});
        seconds[rank] = median_seconds([&] {
          comm.all_reduce_sum(t).wait();
          comm.barrier();
        });
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!error) error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  const double slowest = *std::max_element(seconds.begin(), seconds.end());
  return 2.0 * (ranks - 1.0) / ranks * static_cast<double>(mb) * (1 << 20) / slowest / kGB;
}

// The disk tier's write and read rates in dir: one region of mb, written then read back.
std::pair<double, double> disk_gb_per_s(const std::string& dir, int64_t mb) {
  DiskStore disk(dir, 0);
  const int64_t bytes = mb * (1 << 20);
  const int64_t offset = disk.reserve(bytes);
  at::Tensor buffer = aligned_buffer(bytes / 4);
  buffer.fill_(1.0f);
  const double write = median_seconds([&] { disk.write(offset, buffer).get(); }, 3);
  const double read = median_seconds([&] { disk.read(offset, buffer).get(); }, 3);
  return {bytes / read / kGB, bytes / write / kGB};
}

double memory_total_gb() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024.0 / kGB;
    std::getline(meminfo, key);
  }
  fail("measure profile: /proc/meminfo has no MemTotal");
}

}  // namespace

void measure_profile(const MeasureProfileOptions& o) {
  if (o.out.empty()) fail("measure profile: --out FILE is required");
  // Every argument is checked before a minute of measuring.
  const auto out_status = std::filesystem::symlink_status(o.out);
  if (std::filesystem::is_symlink(out_status))
    fail("measure profile: ", o.out, " is a symlink (the profile is written in place, never through a link)");
  if (std::filesystem::exists(out_status) && !o.overwrite)
    fail("measure profile: ", o.out, " exists (pass --overwrite to replace it)");
  if (o.name.empty()) fail("measure profile: --name must not be empty");
  if (o.threads < 1) fail("measure profile: --threads must be >= 1, found ", o.threads);
  if (o.ranks < 1) fail("measure profile: --ranks must be >= 1, found ", o.ranks);
  if (o.gemm_size < 1 || o.gemm_size > 65536) fail("measure profile: --gemm-size must be in [1, 65536], found ", o.gemm_size);
  for (const auto& [flag, mb] : {std::pair<const char*, int64_t>{"--copy-mb", o.copy_mb}, {"--allreduce-mb", o.allreduce_mb},
                                 {"--disk-mb", o.disk_mb}})
    if (mb < 1 || mb > (int64_t{1} << 20)) fail("measure profile: ", flag, " must be in [1, 1048576], found ", mb);
  if (!std::filesystem::is_directory(o.disk_dir))
    fail("measure profile: --disk-dir ", o.disk_dir, " is not a directory");
  at::set_num_threads(o.threads);
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  const std::string how = format("measured by `mmtrain measure profile` on %s, %s, %d thread(s): ", host, date, o.threads);

  auto step = [](const char* what) { std::fprintf(stderr, "measure profile: %s\n", what); };
  step("GEMM bf16 and fp32");
  const double bf16 = measure_gemm_peak(o.gemm_size, at::kBFloat16, o.threads, kRepeats).flops_per_second / 1e12;
  const double fp32 = measure_gemm_peak(o.gemm_size, at::kFloat, o.threads, kRepeats).flops_per_second / 1e12;
  step("attention");
  const double attention = std::min(1.0, attention_flops_per_second() / (bf16 * 1e12));
  step("memory copy");
  const double memory = copy_gb_per_s(o.copy_mb);
  step("Gloo all-reduce on loopback");
  const double link = allreduce_gb_per_s(o.ranks, o.allreduce_mb);
  step(("the disk under " + o.disk_dir).c_str());
  const auto [disk_read, disk_write] = disk_gb_per_s(o.disk_dir, o.disk_mb);

  nlohmann::ordered_json j;
  j["name"] = o.name;
  j["description"] = format("this machine (%s), one rank of %d thread(s)", host, o.threads);
  j["peak_bf16_tflops"] = bf16;
  j["peak_fp32_tflops"] = fp32;
  j["memory_gb"] = memory_total_gb();
  j["memory_gb_per_s"] = memory;
  j["intra_node_gb_per_s"] = link;
  j["inter_node_gb_per_s"] = link;
  j["host_link_gb_per_s"] = memory;
  j["host_memory_gb"] = j["memory_gb"];
  j["host_memory_gb_per_s"] = memory;
  j["disk_read_gb_per_s"] = disk_read;
  j["disk_write_gb_per_s"] = disk_write;
  j["efficiency"] = {{"gemm", 1.0}, {"attention", attention}, {"comm", 1.0}, {"overlap", 0.5}};
  j["sources"] = {
      {"peak_bf16_tflops", how + format("a %lld-square bf16 GEMM, median of %d", static_cast<long long>(o.gemm_size), kRepeats)},
      {"peak_fp32_tflops", how + format("a %lld-square fp32 GEMM, median of %d", static_cast<long long>(o.gemm_size), kRepeats)},
      {"memory_gb", how + "MemTotal"},
      {"memory_gb_per_s", how + format("a %lld MiB copy, read + write bytes", static_cast<long long>(o.copy_mb))},
      {"intra_node_gb_per_s", how + format("Gloo all-reduce of %lld MiB over %d thread ranks, bus bandwidth",
                                           static_cast<long long>(o.allreduce_mb), o.ranks)},
      {"inter_node_gb_per_s", "one machine: the intra-node figure"},
      {"host_link_gb_per_s", "on a CPU the host is the device: memory_gb_per_s"},
      {"host_memory_gb", "on a CPU the host is the device: memory_gb"},
      {"host_memory_gb_per_s", "on a CPU the host is the device: memory_gb_per_s"},
      {"disk_read_gb_per_s", how + format("the disk tier's reads of %lld MiB under %s", static_cast<long long>(o.disk_mb), o.disk_dir.c_str())},
      {"disk_write_gb_per_s", how + format("the disk tier's writes of %lld MiB under %s", static_cast<long long>(o.disk_mb), o.disk_dir.c_str())},
      {"efficiency", how + "attention: bf16 attention forward + backward over the bf16 GEMM; gemm and comm 1 (measured "
                           "peaks); overlap 0.5 assumed (Gloo takes cores from compute)"}};
  device_profile_from_json(j.dump(), o.out);  // the file must load as a profile
  write_file_no_follow(o.out, j.dump(2) + "\n", "measure profile --out");
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace mmtrain
