// core/scratch_dir.h: a directory of its own under a random name, gone with everything in it when
// the object goes and when the process is ended by SIGTERM (issue 55, item 5).
#include "core/scratch_dir.h"

#include "checkpoint/checkpoint_test_util.h"

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
    first = a.path();
    second = b.path();
    EXPECT_NE(first, second);
    EXPECT_EQ(ScratchDir::path_of(dir.str(), ".eval_from_dcp_", a.id()), first);
    EXPECT_EQ(fs::status(first).permissions() & fs::perms::all, fs::perms::owner_all);
    fill(first);
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

}  // namespace
}  // namespace mmtrain
