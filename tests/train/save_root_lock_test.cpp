// One run per save root: a second lock on it is refused naming the holder's host and pid; the
// lock file of a run that is gone is taken over, saying whose it was; a normal release leaves
// no holder named.
#include "train/save_root_lock.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace mmtrain {
namespace {

TEST(SaveRootLock, ASecondRunIsRefusedNamingTheFirst) {
  testing::TempDir root;
  {
    SaveRootLock first(root.str());
    EXPECT_EQ(first.previous_holder(), "");
    const auto message = testing::error_of([&] { SaveRootLock second(root.str()); });
    EXPECT_CONTAINS(message, "training.save '" + root.str() + "' is in use by another run (host ");
    EXPECT_CONTAINS(message, ", pid " + std::to_string(::getpid()) + ", since ");
  }
  SaveRootLock after_release(root.str());  // released: free again, and nobody named
  EXPECT_EQ(after_release.previous_holder(), "");
}

TEST(SaveRootLock, TheLockFileOfADeadRunIsTakenOver) {
  testing::TempDir root;
  std::ofstream(root / ".mmtrain.lock") << "host gone, pid 4242, since 2026-01-01 00:00:00 UTC\n";
  SaveRootLock lock(root.str());
  EXPECT_EQ(lock.previous_holder(), "host gone, pid 4242, since 2026-01-01 00:00:00 UTC");
}

// A lock file planted as a symlink is refused, not followed: opening it would truncate and write
// whatever file it points at.
TEST(SaveRootLock, ASymlinkedLockFileIsRefused) {
  testing::TempDir root, elsewhere;
  std::ofstream(elsewhere / "precious.txt") << "do not truncate";
  std::filesystem::create_symlink(elsewhere / "precious.txt", root / ".mmtrain.lock");
  EXPECT_CONTAINS(testing::error_of([&] { SaveRootLock lock(root.str(), "convert --save_dir"); }),
                  "convert --save_dir '" + root.str() + "': refused: " + (root / ".mmtrain.lock") + " is a symlink");
  std::ifstream in(elsewhere / "precious.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "do not truncate");
}

}  // namespace
}  // namespace mmtrain
