// PeerWatch names the ranks whose heartbeat stopped (ranks as threads over one HashStore).
#include "dist/peer_watch.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

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

// The heartbeat ends the wait for a stopped rank: the rank watching it is told within a few
// periods (not parallel.timeout_s); a rank that exits normally marks it and alarms nobody.
TEST(PeerWatch, ASilentNeighbourIsReportedAndANormalExitIsNot) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  const milliseconds period(20);
  std::mutex mutex;
  std::vector<std::string> told;
  auto handler = [&](const std::string& message) {
    std::lock_guard<std::mutex> lock(mutex);
    told.push_back(message);
  };
  {
    // Rank 1 exits normally while rank 0 (which watches it) runs on.
    PeerWatch rank0(store, 0, 2, period, handler, 3);
    { PeerWatch rank1(store, 1, 2, period, handler, 3); std::this_thread::sleep_for(5 * period); }
    std::this_thread::sleep_for(15 * period);
  }
  EXPECT_TRUE(told.empty()) << told.front();

  // Rank 1 of a fresh store beats once, then stops (SIGSTOP): rank 0 is told once, naming it.
  c10::intrusive_ptr<c10d::Store> fresh = c10::make_intrusive<c10d::HashStore>();
  fresh->add("mmtrain_heartbeat/1", 1);
  const auto start = std::chrono::steady_clock::now();
  PeerWatch rank0(fresh, 0, 2, period, handler, 3);
  while (std::chrono::steady_clock::now() - start < 50 * period) {
    std::this_thread::sleep_for(period);
    std::lock_guard<std::mutex> lock(mutex);
    if (!told.empty()) break;
  }
  std::this_thread::sleep_for(10 * period);
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].rfind("rank 1 has stopped answering: its heartbeat in the rendezvous store has been silent", 0), 0u)
      << told[0];
}

// A store whose add() hangs while it is frozen, as a TCPStore client does when the store's host
// is SIGSTOPped (it waits for the store timeout, up to parallel.timeout_s).
class FreezableStore : public c10d::HashStore {
 public:
  int64_t add(const std::string& key, int64_t value) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++adds_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return !frozen_; });
    lock.unlock();
    return c10d::HashStore::add(key, value);
  }
  void freeze() {
    std::lock_guard<std::mutex> lock(mutex_);
    frozen_ = true;
  }
  void thaw() {
    std::lock_guard<std::mutex> lock(mutex_);
    frozen_ = false;
    changed_.notify_all();
  }
  // Waits until some add() call has begun after this one was made.
  void wait_for_next_add() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int64_t seen = adds_;
    changed_.wait(lock, [&] { return adds_ > seen; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool frozen_ = false;
  int64_t adds_ = 0;
};

TEST(PeerWatch, StoppingDoesNotWaitForAStoreThatHangs) {
  auto store = c10::make_intrusive<FreezableStore>();
  const milliseconds period(50);
  auto watch = std::make_unique<PeerWatch>(store, 0, 2, period);
  store->freeze();
  store->wait_for_next_add();  // the heartbeat is now inside a hung add()
  // The store answers again after 40 periods: a destructor that waited for the beat would take
  // that long (and without the thaw, forever).
  std::thread thaw_later([&] {
    std::this_thread::sleep_for(40 * period);
    store->thaw();
  });
  const auto started = std::chrono::steady_clock::now();
  watch.reset();
  const auto waited = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - started);
  EXPECT_LT(waited.count(), 20 * period.count()) << "stopping waited " << waited.count() << " ms on a hung store";
  thaw_later.join();  // the left thread finishes its add and ends on its own
  std::this_thread::sleep_for(2 * period);
}

}  // namespace
}  // namespace mmtrain
