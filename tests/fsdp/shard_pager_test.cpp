// The shard pager (fsdp/shard_pager.h) on a disk tier whose writes fail: the failed write-back
// throws naming the offload file, offset and errno, and the shard stays in RAM, unchanged, so a
// later write-back (once the disk takes it) loses nothing; and reading ahead.
#include "fsdp/shard_pager.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <csignal>

namespace mmtrain {
namespace {

TEST(ShardPager, AFailedWriteBackKeepsTheShardInRam) {
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
  pager.page_in(unit);
  const std::string message = testing::error_of([&] { pager.page_out(unit, /*changed=*/true); });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  std::signal(SIGXFSZ, saved_handler);

  EXPECT_CONTAINS(message, "offload file " + tiers->disk->path() + ": writing 4096 bytes at offset 1048576 failed: File too large");
  EXPECT_TRUE(pager.resident(unit));  // the write failed: the shard stayed in RAM, unchanged
  EXPECT_TRUE(testing::bitwise_equal(unit.shard_flat, expected));
  pager.page_out(unit, /*changed=*/true);  // the limit is gone: this write goes through
  pager.page_in(unit);
  EXPECT_TRUE(testing::bitwise_equal(unit.shard_flat, expected));
}

// A unit read ahead is installed by the page_in that follows with the bytes written back last, read
// from the disk once; a read ahead never taken is waited for by the pager's destructor (its buffer
// must outlive the read).
TEST(ShardPager, ReadAheadBringsTheUnitsBytesOnce) {
  testing::TempDir dir;
  auto tiers = OffloadTiers::make(at::kCPU);
  tiers->disk = std::make_shared<DiskStore>(dir.str(), 0, tiers->host_pool);
  std::vector<FsdpUnit> units(3);
  std::vector<at::Tensor> expected;
  for (size_t u = 0; u < units.size(); ++u) {
    units[u].order = u;
    units[u].shard_flat = tiers->host_pool->take({2048}, at::kFloat);
    units[u].shard_flat.copy_(at::arange(2048, at::kFloat) + 10000.0 * u);
    expected.push_back(units[u].shard_flat.clone());
  }
  {
    ShardPager pager(tiers, {&units[0], &units[1], &units[2]});
    pager.page_out_all(/*changed=*/true);
    const int64_t read_before = tiers->disk->bytes_read();
    pager.read_ahead(units[1]);
    pager.read_ahead(units[1]);  // on its way already: nothing more
    EXPECT_FALSE(pager.resident(units[1]));
    pager.page_in(units[1]);
    EXPECT_TRUE(pager.resident(units[1]));
    EXPECT_TRUE(testing::bitwise_equal(units[1].shard_flat, expected[1]));
    EXPECT_EQ(tiers->disk->bytes_read() - read_before, 2048 * 4);
    pager.read_ahead(units[1]);  // resident: nothing
    EXPECT_EQ(tiers->disk->bytes_read() - read_before, 2048 * 4);
    pager.read_ahead(units[2]);  // never taken
  }
  SUCCEED() << "the pager waited for the read still in flight";
}

}  // namespace
}  // namespace mmtrain
