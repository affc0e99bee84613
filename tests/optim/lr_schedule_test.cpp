// LR schedules in Megatron's convention against values worked out by hand: warmup from 0 over
// int(ratio x train_iters) steps, then constant, linear or cosine decay to lr_min at train_iters,
// held there after.
#include "optim/lr_schedule.h"

#include "test_util.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mmtrain {
namespace {

TEST(LrSchedule, WarmupThenConstant) {
  const auto s = LrSchedule::make(1e-3, 0.0, 0.25, 8, "constant");  // 2 warmup steps
  EXPECT_EQ(s.warmup_steps, 2);
  EXPECT_DOUBLE_EQ(s.at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.at(1), 5e-4);
  EXPECT_DOUBLE_EQ(s.at(2), 1e-3);
  EXPECT_DOUBLE_EQ(s.at(7), 1e-3);
}

TEST(LrSchedule, LinearAndCosineDecayToTheFloor) {
  const auto linear = LrSchedule::make(1.0, 0.1, 0.0, 10, "linear");
  EXPECT_DOUBLE_EQ(linear.at(0), 1.0);
  EXPECT_DOUBLE_EQ(linear.at(5), 0.55);  // 0.1 + (1 - 5/10) x 0.9
  EXPECT_DOUBLE_EQ(linear.at(10), 0.1);
  EXPECT_DOUBLE_EQ(linear.at(12), 0.1);  // past train_iters: the floor
  const auto cosine = LrSchedule::make(1.0, 0.1, 0.0, 10, "cosine");
  EXPECT_DOUBLE_EQ(cosine.at(0), 1.0);
  EXPECT_NEAR(cosine.at(5), 0.55, 1e-15);              // 0.1 + 0.5 (cos(pi/2) + 1) x 0.9
  EXPECT_NEAR(cosine.at(2), 0.1 + 0.45 * (std::cos(M_PI * 0.2) + 1.0), 1e-15);
  EXPECT_DOUBLE_EQ(cosine.at(10), 0.1);
  // With warmup, decay runs over the steps after it: 4 warmup of 20, ratio (12 - 4) / 16 = 0.5.
  EXPECT_DOUBLE_EQ(LrSchedule::make(1.0, 0.0, 0.2, 20, "linear").at(12), 0.5);
}

TEST(LrSchedule, UnknownStyleIsNamed) {
  EXPECT_CONTAINS(testing::error_of([] { LrSchedule::make(1.0, 0.0, 0.0, 10, "step"); }),
                  "lr_decay_style: expected constant, linear or cosine, found 'step'");
}

}  // namespace
}  // namespace mmtrain
