#include "record/memory_profile.h"

#include "core/error.h"

#include <c10/core/CPUAllocator.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>

namespace mmtrain {
namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};

void raise_peak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

// Wraps the default CPU allocator: each block gets a 64-byte header holding its size (64 keeps
// the data as aligned as the default allocator's), so that frees know what to subtract and the
// DataPtr stays "simple" (context == data): raw_allocate / raw_deallocate, which oneDNN uses
// for its scratchpads, keep working.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;

  explicit CountingCpuAllocator(c10::Allocator* base) : base_(base), base_free_(base->raw_deleter()) {
    if (!base_free_) fail("tools.memory_profile: the CPU allocator has no raw deleter to wrap");
    instance_ = this;
  }

  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    auto* block = static_cast<char*>(base_->raw_allocate(nbytes + kHeader));
    std::memcpy(block, &nbytes, sizeof(nbytes));
    raise_peak(g_live.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) + static_cast<int64_t>(nbytes));
    void* data = block + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  static void release(void* data) {
    if (!data) return;
    char* block = static_cast<char*>(data) - kHeader;
    size_t nbytes = 0;
    std::memcpy(&nbytes, block, sizeof(nbytes));
    g_live.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    instance_->base_free_(block);
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_free_;
  static CountingCpuAllocator* instance_;
};

CountingCpuAllocator* CountingCpuAllocator::instance_ = nullptr;

void install_counting_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: tensors allocated through it may outlive every other object.
    static auto* counting = new CountingCpuAllocator(c10::GetDefaultCPUAllocator());
    c10::SetCPUAllocator(counting, /*priority=*/100);
  });
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

int64_t live_allocated_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_allocated_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_allocation_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

MemoryProfile::MemoryProfile(const MemoryProfileConfig& config) : config_(config) {
  if (config_.enable) install_counting_allocator();
}

bool MemoryProfile::covers(int64_t iteration) const {
  return config_.enable && iteration >= config_.start_step && (config_.end_step == 0 || iteration <= config_.end_step);
}

void MemoryProfile::begin_step() {
  step_ = StepPeaks{};
  reset_allocation_peak();
  step_.live_start_mb = mib(live_allocated_bytes());
}

MemoryProfile::StepPeaks MemoryProfile::end_step() const { return step_; }

void MemoryProfile::phase_begins(StepPhase) { reset_allocation_peak(); }

void MemoryProfile::phase_ends(StepPhase phase) {
  // A phase runs once per micro-batch (data, forward, backward): keep the highest of them.
  const double peak = mib(peak_allocated_bytes());
  auto& slot = step_.phase_peak_mb[static_cast<size_t>(phase)];
  slot = std::max(slot, peak);
  step_.step_peak_mb = std::max(step_.step_peak_mb, peak);
}

}  // namespace mmtrain
