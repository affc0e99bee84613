// PeerWatch names the ranks whose heartbeat stopped (ranks as threads over one HashStore).
#include "dist/peer_watch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <memory>

namespace mmtrain {
namespace {

using std::chrono::milliseconds;

TEST(PeerWatch, NamesTheRanksWhoseHeartbeatStopped) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  const milliseconds period(20);
  std::vector<std::unique_ptr<PeerWatch>> ranks;
  for (int r = 0; r < 4; ++r) ranks.push_back(std::make_unique<PeerWatch>(store, r, 4, period));
  EXPECT_TRUE(ranks[0]->silent_ranks(10 * period).empty());
  EXPECT_NE(ranks[0]->describe_silent_ranks().find("every other rank still answers"), std::string::npos);

  ranks[3].reset();  // rank 3 dies
  ranks[1].reset();  // and rank 1
  EXPECT_EQ(ranks[0]->silent_ranks(10 * period), (std::vector<int>{1, 3}));
  EXPECT_EQ(ranks[2]->silent_ranks(10 * period), (std::vector<int>{1, 3}));
  EXPECT_EQ(ranks[0]->describe_silent_ranks().rfind("ranks 1 and 3 have stopped answering", 0), 0u)
      << ranks[0]->describe_silent_ranks();
}

TEST(PeerWatch, ARankThatNeverStartedIsSilent) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  PeerWatch rank0(store, 0, 2, milliseconds(20));
  EXPECT_EQ(rank0.silent_ranks(milliseconds(200)), (std::vector<int>{1}));
  EXPECT_EQ(rank0.describe_silent_ranks().rfind("rank 1 has stopped answering", 0), 0u) << rank0.describe_silent_ranks();
}

}  // namespace
}  // namespace mmtrain
