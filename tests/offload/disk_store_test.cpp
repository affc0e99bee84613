// The disk tier's store (offload/disk_store.h): regions read back what was written, in any order of
// queued transfers, and read as zeros before; the file is this store's alone (unlinked at
// creation: two stores of one rank in one directory, as two jobs of one YAML on one node, do not
// share it); a disk without room refuses the reservation naming the bytes; a failed write names the
// file, the offset and the errno.
#include "offload/disk_store.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <unistd.h>

#include <csignal>
#include <filesystem>

namespace mmtrain {
namespace {

TEST(DiskStore, RegionsReadBackWhatWasWrittenAndStartAsZeros) {
  testing::TempDir dir;
  std::string path;
  {
    DiskStore store(dir.str(), 3);
    path = store.path();
    EXPECT_EQ(std::filesystem::path(path).filename(),
              "mmtrain_rank_00003." + std::to_string(::getpid()) + ".offload");
    EXPECT_FALSE(std::filesystem::exists(path));  // unlinked at creation: nothing to leave behind
    // Odd sizes: every region still starts on a block boundary.
    const int64_t a = store.reserve(4 * 1001), b = store.reserve(4 * 5), c = store.reserve(4 * 3000);
    EXPECT_EQ(a % DiskStore::kAlign, 0);
    EXPECT_EQ(b % DiskStore::kAlign, 0);
    EXPECT_EQ(c % DiskStore::kAlign, 0);
    const at::Tensor x = testing::random_tensor({1001}, at::kFloat, 1), z = testing::random_tensor({3000}, at::kFloat, 2);
    at::Tensor wx = aligned_buffer(1001), wz = aligned_buffer(3000);
    wx.copy_(x);
    wz.copy_(z);
    auto w1 = store.write(a, wx.data_ptr(), 4 * 1001);
    auto w2 = store.write(c, wz.data_ptr(), 4 * 3000);
    at::Tensor rx = aligned_buffer(1001), ry = aligned_buffer(5), rz = aligned_buffer(3000);
    ry.fill_(7);
    // Queued behind the writes: the I/O thread runs transfers in order.
    auto r1 = store.read(a, rx.data_ptr(), 4 * 1001), r2 = store.read(b, ry.data_ptr(), 4 * 5),
         r3 = store.read(c, rz.data_ptr(), 4 * 3000);
    for (auto* f : {&w1, &w2, &r1, &r2, &r3}) f->get();
    EXPECT_TRUE(testing::bitwise_equal(rx, x));
    EXPECT_TRUE(testing::bitwise_equal(rz, z));
    EXPECT_TRUE(at::equal(ry, at::zeros({5})));
    EXPECT_EQ(store.bytes_written(), 4096 + 12288);
    EXPECT_EQ(store.bytes_read(), 4096 + 4096 + 12288);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(DiskStore, AMissingDirectoryIsNamed) {
  testing::TempDir dir;
  const std::string missing = dir / "nope";
  EXPECT_CONTAINS(testing::error_of([&] { DiskStore store(missing, 0); }),
                  "training.offload_dir: cannot create " + missing + "/mmtrain_rank_00000." +
                      std::to_string(::getpid()) + ".offload: No such file");
}

// Two jobs of one YAML on one node: the same directory, the same rank. Each store keeps what it
// wrote; before, the second truncated and overwrote the first's file.
TEST(DiskStore, TwoStoresOfOneRankInOneDirectoryKeepTheirOwnBytes) {
  testing::TempDir dir;
  DiskStore first(dir.str(), 0), second(dir.str(), 0);
  const int64_t a = first.reserve(4 * 1024), b = second.reserve(4 * 1024);
  at::Tensor ones = aligned_buffer(1024), twos = aligned_buffer(1024), back = aligned_buffer(1024);
  ones.fill_(1);
  twos.fill_(2);
  first.write(a, ones.data_ptr(), 4 * 1024).get();
  second.write(b, twos.data_ptr(), 4 * 1024).get();
  first.read(a, back.data_ptr(), 4 * 1024).get();
  EXPECT_TRUE(at::equal(back, ones));
  second.read(b, back.data_ptr(), 4 * 1024).get();
  EXPECT_TRUE(at::equal(back, twos));
  EXPECT_TRUE(std::filesystem::is_empty(dir.str()));
}

// The blocks are allocated when a region is reserved: a disk without room says so at start-up,
// naming the bytes, not in the middle of a step (the file size limit stands in for a full disk).
TEST(DiskStore, ADiskWithoutRoomRefusesTheReservation) {
  testing::TempDir dir;
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);
  std::string message;
  {
    DiskStore store(dir.str(), 0);
    store.reserve(32 << 10);
    struct rlimit small = saved;
    small.rlim_cur = 64 << 10;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    message = testing::error_of([&] { store.reserve(1 << 20); });
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  }
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_CONTAINS(message, "training.offload_dir: cannot reserve 1048576 more bytes in " + dir.str() + "/mmtrain_rank_00000.");
  EXPECT_CONTAINS(message, "(1081344 bytes for this rank's file): File too large; the filesystem has ");
}

TEST(DiskStore, AFailedWriteNamesTheFileOffsetAndErrno) {
  testing::TempDir dir;
  std::string path;
  struct rlimit saved {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead of a kill
  std::string message;
  {
    DiskStore store(dir.str(), 0);
    path = store.path();
    const int64_t at = store.reserve(1 << 20);  // allocated before the limit
    struct rlimit small = saved;
    small.rlim_cur = 64 << 10;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    at::Tensor buffer = aligned_buffer(1 << 18);
    auto write = store.write(at + (128 << 10), buffer.data_ptr(), 4096);
    message = testing::error_of([&] { write.get(); });
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved), 0);
  }
  std::signal(SIGXFSZ, saved_handler);
  EXPECT_CONTAINS(message, "offload file " + path +
                               ": writing 4096 bytes at offset 131072 failed: File too large");
}

}  // namespace
}  // namespace mmtrain
