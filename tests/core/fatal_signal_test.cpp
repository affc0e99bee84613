// The fatal-signal handler reports a stack overflow too: it runs on an alternate stack, so the
// overflowed one does not take the report down with it (without sigaltstack the process died
// with an empty stderr).
#include "core/fatal_signal.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

// Not a tail call and not foldable: every level keeps a live frame.
int recurse_forever(volatile int depth) {
  volatile char frame[1024];
  frame[0] = static_cast<char>(depth);
  return recurse_forever(depth + 1) + frame[0];
}

TEST(FatalSignalDeathTest, AStackOverflowIsNamedWithABacktrace) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        install_fatal_signal_handlers();
        recurse_forever(0);
      },
      "mmtrain: fatal signal SIGSEGV.*backtrace:");
}

}  // namespace
}  // namespace mmtrain
