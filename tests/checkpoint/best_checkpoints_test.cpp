#include "checkpoint/best_checkpoints.h"

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

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

// Issue 55, item 4: best.json is rewritten from `latest`'s list, less what is not on disk, before
// pruning removes anything; a resume drops names of checkpoints that are gone and temp files a
// killed write left.
TEST(BestCheckpoints, TheIndexNamesOnlyCheckpointsOnDiskAndIsRewrittenFromLatest) {
  testing::TempDir root;
  namespace fs = std::filesystem;
  for (const char* name : {"iter_0000002", "iter_0000004"}) {
    fs::create_directories(root / name);
    std::ofstream(root / name + "/index.json") << "{}";
  }
  fs::create_directories(root / "iter_0000006");  // no index.json: an interrupted save, not a checkpoint
  const std::vector<BestCheckpoint> best = {{0, 0.5}, {4, 1.0}, {6, 1.2}, {2, 1.5}};
  EXPECT_EQ(iterations(best_checkpoints_on_disk(root.str(), best)), (std::vector<int64_t>{4, 2}));

  EXPECT_TRUE(best_checkpoints_sync_index(root.str()).empty());  // no `latest`: nothing said, nothing written
  EXPECT_FALSE(fs::exists(root / "best.json"));
  std::ofstream(root / "latest") << "iter_0000004\n";
  std::ofstream(root / "iter_0000004/trainer_state.json") << nlohmann::json({{kBestCheckpointsKey, best_checkpoints_json(best)}}).dump();
  EXPECT_EQ(best_checkpoints_sync_index(root.str()), (std::vector<std::string>{"iter_0000004", "iter_0000002"}));
  const auto index = nlohmann::json::parse(std::ifstream(root / "best.json"));
  ASSERT_EQ(index["checkpoints"].size(), 2u) << index.dump();
  EXPECT_EQ(index["checkpoints"][0]["dir"], "iter_0000004");

  std::ofstream(root / "best.json.tmp-99-0") << "{";
  std::ofstream(root / "best.jsonx") << "kept";
  best_checkpoints_remove_stale_temps(root.str());
  EXPECT_FALSE(fs::exists(root / "best.json.tmp-99-0"));
  EXPECT_TRUE(fs::exists(root / "best.jsonx"));
}

}  // namespace
}  // namespace mmtrain
