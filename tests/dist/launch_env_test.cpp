// torchrun's environment is read strictly: a value that does not fit an int is refused, never
// truncated (WORLD_SIZE=4294967297 used to become 1).
#include "dist/runtime.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace mmtrain {
namespace {

class LaunchEnvTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* name : {"WORLD_SIZE", "RANK", "MASTER_ADDR"}) unsetenv(name);
  }
};

TEST_F(LaunchEnvTest, ValuesThatDoNotFitAreRefused) {
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("RANK", "0", 1);
  setenv("WORLD_SIZE", "4294967297", 1);
  EXPECT_CONTAINS(testing::error_of([] { LaunchEnv::from_environment(); }), "WORLD_SIZE='4294967297' is not an integer");
  setenv("WORLD_SIZE", "2x", 1);
  EXPECT_CONTAINS(testing::error_of([] { LaunchEnv::from_environment(); }), "WORLD_SIZE='2x' is not an integer");
  setenv("WORLD_SIZE", "2", 1);
  setenv("RANK", "2", 1);
  EXPECT_CONTAINS(testing::error_of([] { LaunchEnv::from_environment(); }), "RANK=2 is outside WORLD_SIZE=2");
  setenv("RANK", "1", 1);
  const auto env = LaunchEnv::from_environment();
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.rank, 1);
}

}  // namespace
}  // namespace mmtrain
