// tools.memory_profile's counting allocator: live bytes and per-phase peaks follow tensor
// allocations exactly, including oneDNN-style raw allocations.
#include "record/memory_profile.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

namespace mmtrain {
namespace {

TEST(MemoryProfile, PhasePeaksFollowTensorAllocations) {
  MemoryProfileConfig config;
  config.enable = true;
  config.start_step = 2;
  config.end_step = 3;
  MemoryProfile profile(config);
  EXPECT_FALSE(profile.covers(1));
  EXPECT_TRUE(profile.covers(2));
  EXPECT_TRUE(profile.covers(3));
  EXPECT_FALSE(profile.covers(4));

  constexpr int64_t kMiB = 1024 * 1024;
  const int64_t before = live_allocated_bytes();
  auto kept = at::empty({kMiB / 4}, at::kFloat);  // 1 MiB that outlives the step
  EXPECT_EQ(live_allocated_bytes() - before, kMiB);

  profile.begin_step();
  profile.phase_begins(StepPhase::forward);
  {
    auto activation = at::empty({3 * kMiB / 4}, at::kFloat);  // 3 MiB, freed inside the phase
  }
  profile.phase_ends(StepPhase::forward);
  profile.phase_begins(StepPhase::backward);
  auto grad = at::empty({kMiB / 8}, at::kFloat);  // 0.5 MiB
  profile.phase_ends(StepPhase::backward);
  const auto peaks = profile.end_step();
  const double base = static_cast<double>(before) / kMiB + 1.0;
  EXPECT_DOUBLE_EQ(peaks.live_start_mb, base);
  EXPECT_DOUBLE_EQ(peaks.phase_peak_mb[static_cast<size_t>(StepPhase::forward)], base + 3.0);
  EXPECT_DOUBLE_EQ(peaks.phase_peak_mb[static_cast<size_t>(StepPhase::backward)], base + 0.5);
  EXPECT_DOUBLE_EQ(peaks.step_peak_mb, base + 3.0);
  EXPECT_DOUBLE_EQ(peaks.phase_peak_mb[static_cast<size_t>(StepPhase::optimizer)], 0.0);  // not run

  // Raw allocations (oneDNN's scratchpads) count and free through the same wrapper.
  auto* allocator = c10::GetCPUAllocator();
  const int64_t live = live_allocated_bytes();
  void* raw = allocator->raw_allocate(4096);
  EXPECT_EQ(live_allocated_bytes() - live, 4096);
  allocator->raw_deallocate(raw);
  EXPECT_EQ(live_allocated_bytes(), live);
  kept.reset();
  grad.reset();
  EXPECT_EQ(live_allocated_bytes(), before);
}

}  // namespace
}  // namespace mmtrain
