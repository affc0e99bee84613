// The shard pager (fsdp/shard_pager.h) on a disk tier whose writes fail: a scope of resident
// shards left by an exception pages out in its destructor, which must not throw (that would end
// the process in std::terminate with no message). The failed write-back is reported by the
// pager's next call, naming the offload file, offset and errno, and the shards stay in RAM.
#include "fsdp/shard_pager.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>
#include <stdexcept>

namespace mmtrain {
namespace {

TEST(ShardPager, AFailedWriteBackInADestructorIsReportedByTheNextCall) {
  testing::TempDir dir;
  auto tiers = OffloadTiers::make(at::kCPU);
  tiers->disk = std::make_shared<DiskStore>(dir.str(), 0, tiers->host_pool);
  tiers->disk->reserve(1 << 20);  // the unit's region starts at 1 MiB, past the file size limit below
  FsdpUnit unit;
  unit.name = "layers.0";
  unit.shard_flat = tiers->host_pool->take({1024}, at::kFloat);  // page-aligned, as direct I/O needs
  unit.shard_flat.copy_(at::arange(1024, at::kFloat));
  const at::Tensor expected = unit.shard_flat.clone();
  ShardPager pager(tiers, {&unit});
  pager.page_out_all(/*changed=*/true);  // on disk now

  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a kill
  struct rlimit small = saved;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  try {
    ShardPager::Resident shards(&pager, /*changed=*/true);
    throw std::runtime_error("a load failed");  // the scope unwinds: its destructor writes back, and fails
  } catch (const std::runtime_error&) {
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, saved_handler);

  EXPECT_TRUE(pager.resident(unit));  // the write failed: the shard stayed in RAM, unchanged
  EXPECT_TRUE(testing::bitwise_equal(unit.shard_flat, expected));
  const std::string message = testing::error_of([&] { pager.page_out(unit, true); });
  EXPECT_CONTAINS(message, "an earlier write-back of the shards to the disk tier failed");
  EXPECT_CONTAINS(message, "offload file " + tiers->disk->path() + ": writing 4096 bytes at offset 1048576 failed: File too large");
  pager.page_out(unit, true);  // reported once; the limit is gone, so this write goes through
  pager.page_in(unit);
  EXPECT_TRUE(testing::bitwise_equal(unit.shard_flat, expected));
}

}  // namespace
}  // namespace mmtrain
