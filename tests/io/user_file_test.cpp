// io/user_file.h: the reader of files a user named (regular on the opened descriptor, bounded,
// never blocked on a FIFO) and the writer into directories mmtrain does not own (never through a
// link); io/atomic_file.h's temporary file likewise. Issue 47, items 5, 6, 9 and 10.
#include "checkpoint/checkpoint_test_util.h"
#include "core/checked_math.h"
#include "io/atomic_file.h"
#include "core/error.h"
#include "core/subprocess.h"
#include "io/user_file.h"
#include "test_util.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

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

// Issue 55, item 7: a FIFO swapped in between open_append_no_follow's lstat and its open once
// blocked the run before step 1 (metrics.jsonl, TensorBoard). A child process races a swapper
// thread (a file, then a FIFO without reader, renamed over the path, over and over) against
// opens for 2 s; the parent gives it 30 s, and an open that blocked never returns.
TEST(OpenAppendNoFollow, AFifoSwappedInNeverBlocksTheOpen) {
  TempDir dir;
  const std::string path = dir.str() + "/metrics.jsonl", file = dir.str() + "/f", fifo = dir.str() + "/p";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<bool> done{false};
    std::thread swapper([&] {
      while (!done) {
        std::ofstream(file).put('x');
        std::rename(file.c_str(), path.c_str());
        ::mkfifo(fifo.c_str(), 0644);
        std::rename(fifo.c_str(), path.c_str());
      }
    });
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (std::chrono::steady_clock::now() < end) {
      try {
        std::fclose(open_append_no_follow(path, "metrics.jsonl"));
      } catch (const Error&) {
        // a FIFO seen by the lstat or on the descriptor: refused, never blocked on
      }
    }
    done = true;
    swapper.join();
    std::_Exit(0);
  }
  int status = 0;
  bool exited = false;
  for (int waited_ms = 0; waited_ms < 30000 && !exited; waited_ms += 10) {
    exited = ::waitpid(child, &status, WNOHANG) == child;
    if (!exited) ::usleep(10000);
  }
  if (!exited) {
    ::kill(child, SIGKILL);
    ::waitpid(child, &status, 0);
    FAIL() << "an open of " << path << " blocked (a FIFO swapped in after the lstat)";
  }
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// Issue 55, item 5: a program's log (the DCP bridge's <to>.bridge.log) is a new file of its own:
// a symlink planted at its name is replaced, and the file it pointed to is never truncated.
TEST(RunProcess, AnOutputPathIsNeverFollowedOrTruncatedThroughALink) {
  TempDir dir;
  const std::string victim = dir.str() + "/victim", log = dir.str() + "/x.bridge.log";
  std::ofstream(victim) << "precious";
  std::filesystem::create_symlink(victim, log);
  ProcessOptions options;
  options.output_path = log;
  EXPECT_EQ(run_process({"sh", "-c", "echo hello"}, options), 0);
  EXPECT_EQ(slurp(victim), "precious");
  EXPECT_FALSE(std::filesystem::is_symlink(log));
  EXPECT_EQ(slurp(log), "hello\n");
}

}  // namespace
}  // namespace mmtrain
