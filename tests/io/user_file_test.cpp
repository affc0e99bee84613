// io/user_file.h: the reader of files a user named (regular on the opened descriptor, bounded,
// never blocked on a FIFO) and the writer into directories mmtrain does not own (never through a
// link); io/atomic_file.h's temporary file likewise. Issue 47, items 5, 6, 9 and 10.
#include "checkpoint/checkpoint_test_util.h"
#include "core/checked_math.h"
#include "io/atomic_file.h"
#include "io/user_file.h"
#include "test_util.h"

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace mmtrain {
namespace {

using mmtrain::testing::error_of;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ReadUserFile, RefusesWhatIsNotARegularFileWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.str() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_CONTAINS(error_of([&] { read_user_file(fifo, "profile " + fifo, 1 << 20); }),
                  "profile " + fifo + ": not a regular file (a FIFO, device or socket)");
  const std::string zero = dir.str() + "/zero";
  std::filesystem::create_symlink("/dev/zero", zero);
  EXPECT_CONTAINS(error_of([&] { read_user_file(zero, "x", 1 << 20); }), "x: not a regular file");
  EXPECT_CONTAINS(error_of([&] { read_user_file(dir.str(), "y", 1 << 20); }), "y: not a regular file (a directory)");
  EXPECT_CONTAINS(error_of([&] { read_user_file(dir.str() + "/none", "z", 1 << 20); }), "z: no such file");
}

TEST(ReadUserFile, CapsTheSizeBeforeReading) {
  TempDir dir;
  const std::string path = dir.str() + "/big";
  std::ofstream(path) << std::string(1000, 'a');
  EXPECT_EQ(read_user_file(path, "big", 1000).size(), 1000u);
  EXPECT_CONTAINS(error_of([&] { read_user_file(path, "big", 999); }),
                  "big: 1000 bytes, over the 999 bytes this kind of file may hold");
}

TEST(WriteFileNoFollow, ReplacesAFileButNeverWritesThroughALink) {
  TempDir dir;
  const std::string victim = dir.str() + "/victim", out = dir.str() + "/out";
  std::ofstream(victim) << "precious";
  write_file_no_follow(out, "one", "out");
  write_file_no_follow(out, "two", "out");
  EXPECT_EQ(slurp(out), "two");
  const std::string link = dir.str() + "/link", dangling = dir.str() + "/dangling";
  std::filesystem::create_symlink(victim, link);
  std::filesystem::create_symlink(dir.str() + "/nowhere", dangling);
  EXPECT_CONTAINS(error_of([&] { write_file_no_follow(link, "x", "plan.json"); }), "plan.json: refused: ");
  EXPECT_CONTAINS(error_of([&] { write_file_no_follow(dangling, "x", "--out"); }), "is a symlink");
  EXPECT_CONTAINS(error_of([&] { open_append_no_follow(link, "metrics.jsonl"); }), "is a symlink");
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(std::filesystem::exists(dir.str() + "/nowhere"));
  // No temporary file is left behind.
  int entries = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(dir.str())) ++entries;
  EXPECT_EQ(entries, 4);  // victim, out, link, dangling
}

TEST(AtomicFile, NeverWritesThroughALinkPlantedAtItsTemporaryName) {
  TempDir dir;
  const std::string victim = dir.str() + "/victim", out = dir.str() + "/index.json";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, out + ".tmp");
  file_write_atomic(out, "{}");
  EXPECT_EQ(slurp(out), "{}");
  EXPECT_EQ(slurp(victim), "precious");
}

TEST(CheckedMath, OverflowIsANamedError) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_CONTAINS(error_of([] { checked_mul(int64_t{1} << 32, int64_t{1} << 31, "plan: bytes"); }),
                  "plan: bytes: 4294967296 x 2147483648 overflows int64");
  EXPECT_CONTAINS(error_of([] { checked_add(INT64_MAX, 1, "rows"); }), "rows: 9223372036854775807 + 1 overflows int64");
  EXPECT_EQ(checked_tokens(kMaxTokens, "t"), kMaxTokens);
  EXPECT_CONTAINS(error_of([] { checked_tokens(kMaxTokens + 1, "--seqlen"); }),
                  "--seqlen: 4294967297 tokens, more than the 2^32");
  EXPECT_CONTAINS(error_of([] { checked_tokens(-1, "--seqlen"); }), "--seqlen: -1 tokens, negative");
}

}  // namespace
}  // namespace mmtrain
