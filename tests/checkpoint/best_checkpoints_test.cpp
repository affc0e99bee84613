#include "checkpoint/best_checkpoints.h"

#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace mmtrain {
namespace {

std::vector<int64_t> iterations(const std::vector<BestCheckpoint>& best) {
  std::vector<int64_t> out;
  for (const auto& b : best) out.push_back(b.iteration);
  return out;
}

TEST(BestCheckpoints, KeepsTheLowestLossesAndNeverANonFiniteOne) {
  std::vector<BestCheckpoint> best;
  best = best_checkpoints_update(best, 2, 3.0, 2);
  best = best_checkpoints_update(best, 4, 1.0, 2);
  best = best_checkpoints_update(best, 6, NAN, 2);       // recorded elsewhere, never the best
  best = best_checkpoints_update(best, 8, INFINITY, 2);
  EXPECT_EQ(iterations(best), (std::vector<int64_t>{4, 2}));
  best = best_checkpoints_update(best, 10, 2.0, 2);      // pushes out the worst
  EXPECT_EQ(iterations(best), (std::vector<int64_t>{4, 10}));
  best = best_checkpoints_update(best, 12, 1.0, 2);      // a tie: the earlier iteration first
  EXPECT_EQ(iterations(best), (std::vector<int64_t>{4, 12}));
}

TEST(BestCheckpoints, RoundTripsThroughTrainerStateAndRefusesMalformedEntries) {
  const std::vector<BestCheckpoint> best = {{4, 1.5}, {2, 2.25}};
  const nlohmann::json state = {{kBestCheckpointsKey, best_checkpoints_json(best)}};
  const auto back = best_checkpoints_of(state, "trainer_state.json");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].iteration, 2);
  EXPECT_EQ(back[1].eval_loss, 2.25);
  EXPECT_TRUE(best_checkpoints_of(nlohmann::json::object(), "x").empty());
  for (const auto& bad : {nlohmann::json(5), nlohmann::json::array({{{"iteration", -1}, {"eval_loss", 1.0}}}),
                          nlohmann::json::array({{{"iteration", 3}, {"eval_loss", "low"}}})}) {
    try {
      best_checkpoints_of({{kBestCheckpointsKey, bad}}, "iter_3/trainer_state.json");
      FAIL() << bad.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("iter_3/trainer_state.json: best_checkpoints"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mmtrain
