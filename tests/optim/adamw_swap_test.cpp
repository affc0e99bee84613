// AdamW with its moments swapped out (AdamW::offload_moments, optim/swapped_state.h), on the
// disk tier and on the host tier, against the same AdamW in memory: chunks that do not divide the
// params, and an empty one (an FSDP unit of frozen params only); params and moments bitwise equal after every
// step, a checkpoint-style round trip of the moments, and NaN found in the chunk that holds it.
#include "optim/adamw.h"

#include "offload/host_store.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <limits>

namespace mmtrain {
namespace {

constexpr int64_t kChunk = 1024;  // the smallest chunk: params of 1-3 chunks and a partial one

struct Pair {
  std::vector<at::Tensor> params, grads;
  std::unique_ptr<AdamW> adamw;
};

// One tier's store, and what it moved so far in each direction.
struct Tier {
  std::string name;
  testing::TempDir dir;
  std::shared_ptr<OffloadStats> stats = std::make_shared<OffloadStats>();
  std::shared_ptr<TierStore> store;

  explicit Tier(const std::string& which) : name(which) {
    if (which == "disk")
      store = std::make_shared<DiskStore>(dir.str(), 0);
    else
      store = std::make_shared<HostStore>(std::make_shared<HostPool>(), std::make_shared<CopyStream>(at::kCPU, stats));
  }
  int64_t bytes_written() const {
    if (auto* disk = dynamic_cast<DiskStore*>(store.get())) return disk->bytes_written();
    return stats->to_host_bytes;
  }
};

class AdamWSwapped : public ::testing::TestWithParam<std::string> {};

Pair make(const std::vector<at::Tensor>& init, const AdamWOptions& options) {
  Pair out;
  for (const auto& p : init) {
    out.params.push_back(p.clone());
    out.grads.push_back(at::zeros_like(p));
  }
  out.adamw = std::make_unique<AdamW>(out.params, out.grads, options);
  return out;
}

TEST_P(AdamWSwapped, EqualsTheInMemoryStepBitwise) {
  Tier tier(GetParam());
  const AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const std::vector<at::Tensor> init = {at::randn({2500}, gen), at::randn({7}, gen), at::randn({3, 700}, gen),
                                        at::zeros({0})};
  Pair memory = make(init, options), disk = make(init, options);
  disk.adamw->offload_moments(tier.store, kChunk);
  EXPECT_EQ(disk.adamw->state_bytes(), 3 * 2 * kChunk * 4);  // three windows, whatever the params
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < init.size(); ++i) {
      const auto g = at::randn(init[i].sizes(), gen);
      memory.grads[i].copy_(g);
      disk.grads[i].copy_(g);
    }
    memory.adamw->step(1e-2 * (step + 1));
    disk.adamw->step(1e-2 * (step + 1));
    for (size_t i = 0; i < init.size(); ++i) {
      ASSERT_TRUE(testing::bitwise_equal(disk.params[i], memory.params[i])) << "param " << i << " step " << step;
      const auto want = memory.adamw->moments(i), got = disk.adamw->moments(i);
      ASSERT_TRUE(testing::bitwise_equal(got.exp_avg, want.exp_avg)) << "exp_avg " << i << " step " << step;
      ASSERT_TRUE(testing::bitwise_equal(got.exp_avg_sq, want.exp_avg_sq)) << "exp_avg_sq " << i << " step " << step;
    }
  }
  // Written per step, two moments of each param but the empty one: on disk in whole 4096-byte
  // blocks of 1024 floats (2500 elements -> 3, 7 -> 1, 2100 -> 3), to the host as they are.
  const int64_t per_step = GetParam() == "disk" ? (3 + 1 + 3) * 4096 * 2 : (2500 + 7 + 2100) * 4 * 2;
  EXPECT_EQ(tier.bytes_written(), per_step * 5);
}

// Moments offloaded before they are used never exist in memory (before, AdamW built 8 bytes per
// parameter of zeros and then handed them to the store): the allocator is never called, and the
// swapped steps still equal the in-memory ones.
TEST_P(AdamWSwapped, MomentsOffloadedAtStartNeverExistInMemory) {
  Tier tier(GetParam());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  const std::vector<at::Tensor> init = {at::randn({2500}, gen), at::randn({7}, gen)};
  int64_t allocated = 0;
  std::vector<at::Tensor> params, grads;
  for (const auto& p : init) {
    params.push_back(p.clone());
    grads.push_back(at::randn(p.sizes(), gen));
  }
  AdamW swapped(params, grads, {}, [&](const at::Tensor& p) {
    allocated += p.numel();
    return at::zeros_like(p);
  });
  swapped.offload_moments(tier.store, kChunk);
  Pair memory = make({init[0], init[1], at::zeros({2, 5}), at::zeros({3})}, {});
  for (size_t i = 0; i < 2; ++i) memory.grads[i].copy_(grads[i]);
  swapped.step(1e-2);
  memory.adamw->step(1e-2);
  EXPECT_EQ(allocated, 0);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(testing::bitwise_equal(params[i], memory.params[i])) << i;
  // In memory, the moments appear with the first step, and are counted before it all the same.
  AdamW in_memory(params, grads, {}, [&](const at::Tensor& p) {
    allocated += p.numel();
    return at::zeros_like(p);
  });
  EXPECT_EQ(in_memory.state_bytes(), 2 * (2500 + 7) * 4);
  EXPECT_EQ(allocated, 0);
  in_memory.step(1e-2);
  EXPECT_EQ(allocated, 2 * (2500 + 7));
}

TEST_P(AdamWSwapped, MomentsSetAndReadBackAndResumeEqually) {
  Tier tier(GetParam());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const std::vector<at::Tensor> init = {at::randn({1500}, gen), at::randn({9}, gen), at::randn({2, 5}, gen),
                                        at::randn({3}, gen)};
  Pair memory = make(init, {}), disk = make(init, {});
  disk.adamw->offload_moments(tier.store, kChunk);
  for (size_t i = 0; i < init.size(); ++i) {  // as a checkpoint load does
    const auto m = at::randn(init[i].sizes(), gen), v = at::rand(init[i].sizes(), gen);
    memory.adamw->set_moments(i, m, v);
    disk.adamw->set_moments(i, m, v);
    EXPECT_TRUE(testing::bitwise_equal(disk.adamw->moments(i).exp_avg, m));
    EXPECT_TRUE(testing::bitwise_equal(disk.adamw->moments(i).exp_avg_sq, v));
    memory.grads[i].copy_(at::randn(init[i].sizes(), gen));
    disk.grads[i].copy_(memory.grads[i]);
  }
  memory.adamw->step(1e-3);
  disk.adamw->step(1e-3);
  for (size_t i = 0; i < init.size(); ++i) EXPECT_TRUE(testing::bitwise_equal(disk.params[i], memory.params[i]));
  EXPECT_CONTAINS(testing::error_of([&] { disk.adamw->set_moments(1, at::zeros({8}), at::zeros({8})); }),
                  "AdamW: moments of param 1 must be shaped [9], got [8]");
}

// Params that leave memory after their update (shards on disk) are read for NaN/Inf in each
// updated chunk while it is in RAM; resident ones are left to the trainer's one pass after the step
// (train/state_finite.h), and the moments need none (finite gradients keep them finite).
TEST_P(AdamWSwapped, FindsANonFiniteWeightInTheChunkOfAPagedParam) {
  Tier tier(GetParam());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  const std::vector<at::Tensor> init = {at::randn({3000}, gen), at::randn({9}, gen), at::randn({2, 5}, gen),
                                        at::randn({3}, gen)};
  Pair resident = make(init, {}), paged = make(init, {});
  for (auto* pair : {&resident, &paged}) {
    pair->adamw->offload_moments(tier.store, kChunk);
    pair->grads[0].fill_(1);
    pair->grads[0][2100] = std::numeric_limits<float>::infinity();  // third chunk of param 0: its weight goes NaN
  }
  paged.adamw->set_residency([](size_t) {}, [](size_t) {});  // paged out after each update
  resident.adamw->step(1e-3);
  paged.adamw->step(1e-3);
  EXPECT_FALSE(resident.adamw->first_non_finite_paged_weight());
  const auto bad = paged.adamw->first_non_finite_paged_weight();
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->param, 0u);
  EXPECT_EQ(bad->element, 2100);
  paged.grads[0][2100] = 1.0f;
  paged.adamw->step(1e-3);  // each step starts afresh (the weight is NaN still, so it is found again)
  ASSERT_TRUE(paged.adamw->first_non_finite_paged_weight());
  EXPECT_EQ(paged.adamw->first_non_finite_paged_weight()->element, 2100);
}

INSTANTIATE_TEST_SUITE_P(Tiers, AdamWSwapped, ::testing::Values("disk", "host"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace mmtrain
