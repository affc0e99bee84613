// core/scratch_dir.h: a directory of its own under a random name, gone with everything in it when
// the object goes and when the process is ended by SIGTERM (issue 55, item 5).
#include "core/scratch_dir.h"

#include "checkpoint/checkpoint_test_util.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

void fill(const fs::path& dir) {
  fs::create_directories(dir / "iter_0000000" / "deeper");
  std::ofstream(dir / "iter_0000000" / "rank_00000.safetensors") << "x";
  std::ofstream(dir / "iter_0000000" / "deeper" / "f") << "y";
  fs::create_symlink("/etc/hostname", dir / "link");  // removed as a link, never followed
}

TEST(ScratchDir, IsNewEachTimeAndGoesWithEverythingInIt) {
  TempDir dir;
  std::string first, second;
  {
    ScratchDir a(dir.str(), ".eval_from_dcp_"), b(dir.str(), ".eval_from_dcp_");
    first = a.name_path();
    second = b.name_path();
    EXPECT_NE(first, second);
    EXPECT_EQ(ScratchDir::path_of(dir.str(), ".eval_from_dcp_", static_cast<uint64_t>(a.identity()[0])), first);
    EXPECT_EQ(fs::status(first).permissions() & fs::perms::all, fs::perms::owner_all);
    fill(a.path());
    EXPECT_TRUE(fs::exists(fs::path(first) / "iter_0000000" / "deeper" / "f"));
  }
  EXPECT_FALSE(fs::exists(first));
  EXPECT_FALSE(fs::exists(second));
  EXPECT_TRUE(fs::exists("/etc/hostname"));
  EXPECT_TRUE(fs::is_empty(dir.str()));
}

TEST(ScratchDir, IsRemovedWhenTheProcessIsTerminated) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ScratchDir scratch(dir.str(), ".x_");
    fill(scratch.path());
    ::write(ready[1], "1", 1);
    for (;;) ::pause();  // until SIGTERM
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_FALSE(fs::is_empty(dir.str()));
  ::kill(child, SIGTERM);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM) << status;  // the signal's own course
  EXPECT_TRUE(fs::is_empty(dir.str()));
  ::close(ready[0]);
  ::close(ready[1]);
}

// A watcher renames the scratch directory and plants a link to another directory at its name:
// what is written through path() still lands in the scratch directory (wherever it now is), never
// where the link points, and the link is not removed as if it were the scratch directory.
TEST(ScratchDir, ARenameAndAPlantedLinkRedirectNothing) {
  TempDir dir, victim;
  std::string moved = (fs::path(dir.str()) / "moved").string(), name;
  {
    ScratchDir scratch(dir.str(), ".x_");
    name = scratch.name_path();
    fs::rename(scratch.name_path(), moved);
    fs::create_directory_symlink(victim.str(), scratch.name_path());
    std::ofstream(fs::path(scratch.path()) / "latest") << "7";
    EXPECT_TRUE(fs::exists(fs::path(moved) / "latest"));
    EXPECT_TRUE(fs::is_empty(victim.str()));
    // Another rank opening it by name finds the link, and says so.
    EXPECT_THROW(ScratchDirView(dir.str(), ".x_", scratch.identity()), Error);
  }
  EXPECT_TRUE(fs::is_symlink(name));  // not the scratch directory: left where the watcher put it
  EXPECT_TRUE(fs::is_empty(moved));  // emptied through its descriptor
  EXPECT_TRUE(fs::is_empty(victim.str()));
}

TEST(ScratchDirView, OpensTheSameDirectoryByName) {
  TempDir dir;
  ScratchDir scratch(dir.str(), ".x_");
  ScratchDirView view(dir.str(), ".x_", scratch.identity());
  std::ofstream(fs::path(scratch.path()) / "a") << "1";
  EXPECT_TRUE(fs::exists(fs::path(view.path()) / "a"));
  auto other = scratch.identity();
  other[4] += 1;  // another inode
  EXPECT_THROW(ScratchDirView(dir.str(), ".x_", other), Error);
}

// What the test below runs in a fresh process: the first ScratchDir of a process whose SIGHUP was
// ignored when it started (nohup), then a hangup. Not run on its own.
TEST(ScratchDirHelper, DISABLED_FirstScratchDirThenAHangup) {
  ScratchDir scratch(::testing::TempDir(), ".hup_");
  ::raise(SIGHUP);
}

// nohup: SIGHUP ignored when the process starts stays ignored after its first ScratchDir (the
// handler would make it fatal). A fresh process (exec), since this one installed its handlers in
// the tests before.
TEST(ScratchDir, AnIgnoredHangupStaysIgnored) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::signal(SIGHUP, SIG_IGN);  // survives exec, as under nohup
    ::execl("/proc/self/exe", "mmtrain_tests", "--gtest_also_run_disabled_tests",
            "--gtest_filter=ScratchDirHelper.DISABLED_FirstScratchDirThenAHangup", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

}  // namespace
}  // namespace mmtrain
