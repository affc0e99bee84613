// The offload tier layer on CPU: the host pool reuses a buffer once its tensor dies and counts
// what it hands out; copies count their bytes per direction; the host store moves a region's
// chunks to a window and back unchanged.
#include "offload/host_store.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

TEST(HostPool, ReusesABufferOnceItsTensorDies) {
  HostPool pool;
  void* first = nullptr;
  {
    at::Tensor a = pool.take({1000}, at::kFloat);  // 4000 bytes: one page
    first = a.data_ptr();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 4096, 0u);
    EXPECT_EQ(pool.held_bytes(), 4096);
    at::Tensor b = pool.take_zeros({3, 700}, at::kFloat);  // 8400 bytes: three pages
    EXPECT_EQ(b.sum().item<float>(), 0.0f);
    EXPECT_EQ(pool.held_bytes(), 4096 + 3 * 4096);
  }
  EXPECT_EQ(pool.held_bytes(), 0);
  EXPECT_EQ(pool.pooled_bytes(), 4 * 4096);
  EXPECT_EQ(pool.peak_held_bytes(), 4 * 4096);
  at::Tensor again = pool.take({1024}, at::kFloat);  // the same page size: the same buffer
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(pool.pooled_bytes(), 3 * 4096);
  at::Tensor bf16 = pool.take({2048}, at::kBFloat16);  // another tensor of one page: a fresh one
  EXPECT_NE(bf16.data_ptr(), first);
  EXPECT_EQ(bf16.scalar_type(), at::kBFloat16);
}

// A copy that is still running when its host tensor dies (on CUDA: the side stream has not reached
// it yet) keeps its buffer from the next take() until it is done. The stand-in copy completes only
// when waited on, and records whether the bytes were handed out before that.
TEST(HostPool, ABufferIsNotReusedBeforeItsCopyFinishes) {
  struct LateCopy : CopyEvent::Impl {
    bool finished = false;
    void synchronize() override { finished = true; }
    bool query() override { return finished; }
  };
  HostPool pool;
  auto late = std::make_shared<LateCopy>();
  void* first = nullptr;
  {
    at::Tensor staged = pool.take({1024}, at::kFloat);
    first = staged.data_ptr();
    pool.record_use(staged, CopyEvent(late));  // a device -> host copy into it, still in flight
    pool.record_use(at::ones({4}), CopyEvent(std::make_shared<LateCopy>()));  // not the pool's: ignored
  }  // the tensor dies with its copy in flight
  EXPECT_FALSE(late->finished);
  at::Tensor reused = pool.take({1024}, at::kFloat);
  EXPECT_EQ(reused.data_ptr(), first);  // the same buffer ...
  EXPECT_TRUE(late->finished);          // ... only once its copy was waited for
}

TEST(HostPool, ABufferOutlivesItsPool) {
  at::Tensor kept;
  {
    HostPool pool;
    kept = pool.take_zeros({16}, at::kFloat);
  }
  kept.fill_(2);  // still valid memory: freed when the tensor dies
  EXPECT_EQ(kept.sum().item<float>(), 32.0f);
}

TEST(CopyStream, CountsBytesPerDirectionAndCopiesValues) {
  auto stats = std::make_shared<OffloadStats>();
  CopyStream copies(at::kCPU, stats);
  const at::Tensor src = at::arange(10, at::kFloat);
  at::Tensor host = at::empty({10}), device = at::empty({10}, at::kBFloat16);
  copies.to_host(host, src).wait();
  CopyEvent back = copies.to_device(device, host);
  EXPECT_TRUE(back.done());  // on CPU a copy is done when it returns
  back.wait_on_device();
  EXPECT_TRUE(testing::bitwise_equal(host, src));
  EXPECT_TRUE(testing::bitwise_equal(device, src.to(at::kBFloat16)));
  const OffloadCounts counts = stats->snapshot();
  EXPECT_EQ(counts.to_host_bytes, 40);
  EXPECT_EQ(counts.to_device_bytes, 40);  // counted as the source's bytes
  EXPECT_EQ((counts - counts).to_host_bytes, 0);
}

// A GPU's waits are known only once the device ran past them: recorded unsettled, measured and
// added when settled (at the step's end), once each; a step's counts are a difference.
TEST(OffloadStats, DeviceWaitsCountWhenSettled) {
  OffloadStats stats;
  int measured = 0;
  stats.add_unsettled_device_wait([&] { ++measured; return int64_t{1500}; });
  stats.add_unsettled_device_wait([&] { ++measured; return int64_t{250}; });
  const OffloadCounts before = stats.snapshot();
  EXPECT_EQ(before.device_wait_us, 0);
  EXPECT_EQ(measured, 0);  // nothing is read before the step ends
  stats.settle_device_waits();
  stats.settle_device_waits();  // settled once
  EXPECT_EQ(measured, 2);
  EXPECT_EQ((stats.snapshot() - before).device_wait_us, 1750);
}

TEST(HostStore, RegionsRoundTripThroughWindows) {
  auto stats = std::make_shared<OffloadStats>();
  HostStore store(std::make_shared<HostPool>(), std::make_shared<CopyStream>(at::kCPU, stats));
  const int64_t a = store.reserve(3000 * 4), empty = store.reserve(0), b = store.reserve(500 * 4);
  EXPECT_EQ(empty, b);  // a region of nothing takes no room
  EXPECT_EQ(store.size(), 3500 * 4);
  at::Tensor window = store.window(1024);
  EXPECT_EQ(window.sum().item<float>(), 0.0f);
  const at::Tensor values = at::randn({1024});
  window.copy_(values);
  store.write(a + 2048 * 4, window.narrow(0, 0, 952)).get();  // the region's last 952 elements
  store.write(b, window.narrow(0, 0, 500)).get();
  window.zero_();
  store.read(a + 2048 * 4, window.narrow(0, 0, 952)).get();
  EXPECT_TRUE(testing::bitwise_equal(window.narrow(0, 0, 952), values.narrow(0, 0, 952)));
  store.read(a, window).get();  // never written: zeros
  EXPECT_EQ(window.abs().sum().item<float>(), 0.0f);
  EXPECT_CONTAINS(testing::error_of([&] { store.read(a + 2500 * 4, window.narrow(0, 0, 1000)); }),
                  "run past their region");
  EXPECT_EQ(stats->snapshot().to_host_bytes, (952 + 500) * 4);
}

}  // namespace
}  // namespace mmtrain
