// One run per save root: a second lock on it is refused naming the holder's host and pid; the
// lock file of a run that is gone is taken over, saying whose it was; a normal release leaves
// no holder named.
#include "train/save_root_lock.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>

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

}  // namespace
}  // namespace mmtrain
