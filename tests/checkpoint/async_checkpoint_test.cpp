// checkpoint/async_checkpoint.h on thread-per-rank Gloo worlds: an asynchronous save writes the
// very bytes a synchronous one writes, of the tensors as they were at start() (training may
// overwrite them right after), `latest` moves only once every rank's file is written, and a
// write that fails in the background stops every rank with the file named while `latest` keeps
// the previous checkpoint.
#include "checkpoint/async_checkpoint.h"
#include "checkpoint_test_util.h"
#include "core/error.h"
#include "multirank_harness.h"
#include "toy_checkpoint.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <thread>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;
using testing::chunk_shards;
using testing::expect_reads_back;
using testing::model_tensors;
using testing::rank_state_of;
using testing::read_bytes;
using testing::save_model;
using testing::TempDir;

const nlohmann::json kGlobalState = {{"iteration", 20}, {"consumed_samples", 160}};
const nlohmann::json kPlan = {{"unit", "layers.{*}"}};

// This rank's shards plus, on rank 1 only, a 32 MiB tensor: rank 0 finishes writing long before
// rank 1, and its polls meanwhile must wait for rank 1 without touching its own finished job.
std::vector<ShardedTensor> uneven_shards(const std::vector<std::pair<std::string, at::Tensor>>& full, int rank,
                                         const at::Tensor& big) {
  auto shards = chunk_shards(full, rank, 2);
  shards.push_back({"big", big.sizes().vec(), 0, rank == 1 ? big : big.slice(0, 0, 0)});
  return shards;
}

TEST(AsyncCheckpoint, WritesTheBytesOfASyncSaveOfTheStateAtStart) {
  TempDir async_root, sync_root;
  const at::Tensor big = testing::random_tensor({1, 8 << 20}, at::kFloat, 9);
  std::vector<std::string> latest_after_start(2);
  std::vector<std::string> completed_dir(2);
  testing::run_ranks(2, [&](Comm& comm) {
    save_model(async_root.str(), 10, comm, 100);
    save_model(sync_root.str(), 10, comm, 100);
    auto full = model_tensors(200);
    checkpoint_save(sync_root.str(), 20, comm, uneven_shards(full, comm.rank(), big), kGlobalState,
                    rank_state_of(comm.rank(), 20), kPlan);

    AsyncCheckpointSaver saver(comm);
    const auto staged = saver.start(async_root.str(), 20, uneven_shards(full, comm.rank(), big), kGlobalState,
                                    rank_state_of(comm.rank(), 20), kPlan, 0);
    EXPECT_GT(staged.bytes, 0);
    if (comm.rank() == 0) latest_after_start[0] = read_bytes(async_root / "latest");
    for (auto& [name, t] : full) t.zero_();  // training goes on: the save must hold the values at start()
    EXPECT_THROW_WITH(saver.start(async_root.str(), 30, chunk_shards(full, comm.rank(), 2), kGlobalState,
                                  rank_state_of(comm.rank(), 30), kPlan, 0),
                      "iter_0000020", "still in flight");
    // poll() until done, as the trainer does at each step boundary.
    std::optional<AsyncCheckpointSaver::Completed> done;
    for (int i = 0; i < 10000 && !done; ++i) {
      done = saver.poll();
      if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(done.has_value());
    completed_dir[comm.rank()] = done->dir;
    EXPECT_FALSE(saver.in_flight());
    EXPECT_FALSE(saver.wait().has_value());  // nothing left in flight
  });
  EXPECT_EQ(latest_after_start[0], "iter_0000010\n");
  EXPECT_EQ(completed_dir[0], async_root / "iter_0000020");
  EXPECT_EQ(completed_dir[1], completed_dir[0]);
  EXPECT_EQ(read_bytes(async_root / "latest"), "iter_0000020\n");
  expect_reads_back(async_root.str(), 200, 3);
  for (const char* file : {"index.json", "trainer_state.json", "rank_00000.safetensors", "rank_00001.safetensors"})
    EXPECT_EQ(read_bytes(async_root / (std::string("iter_0000020/") + file)),
              read_bytes(sync_root / (std::string("iter_0000020/") + file)))
        << file;
}

TEST(AsyncCheckpoint, KeepLatestKPrunesAfterTheCommit) {
  TempDir root;
  std::vector<std::string> pruned;
  testing::run_ranks(2, [&](Comm& comm) {
    AsyncCheckpointSaver saver(comm);
    for (int64_t iteration : {10, 20, 30}) {
      const auto full = model_tensors(100 + iteration);
      saver.start(root.str(), iteration, chunk_shards(full, comm.rank(), 2), kGlobalState,
                  rank_state_of(comm.rank(), iteration), kPlan, 2);
      const auto done = saver.wait();
      ASSERT_TRUE(done.has_value());
      if (comm.rank() == 0) pruned.insert(pruned.end(), done->pruned.removed.begin(), done->pruned.removed.end());
      if (comm.rank() == 1) EXPECT_TRUE(done->pruned.removed.empty());
    }
  });
  EXPECT_EQ(pruned, std::vector<std::string>{"iter_0000010"});
  EXPECT_FALSE(fs::exists(root / "iter_0000010"));
  expect_reads_back(root.str(), 130, 2);
  expect_reads_back(root / "iter_0000020", 120, 2);
}

// A write that fails in the background (here: the file size limit, EFBIG, as ENOSPC would) stops
// every rank at the next poll, the failing rank naming its file and the error, the others naming
// that rank; nothing of the save is committed.
TEST(AsyncCheckpoint, AFailedBackgroundWriteStopsEveryRankAndLatestStays) {
  TempDir root;
  std::vector<std::string> messages(2);
  struct rlimit saved_limit {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  auto saved_handler = std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing us
  testing::run_ranks(2, [&](Comm& comm) {
    save_model(root.str(), 10, comm, 100);
    comm.barrier();
    if (comm.rank() == 0) {
      struct rlimit small = saved_limit;
      small.rlim_cur = 64 << 10;  // rank files of the 1 MiB tensor below cannot be written
      ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    }
    comm.barrier();
    auto full = model_tensors(200);
    full.emplace_back("big", testing::random_tensor({512, 512}, at::kFloat, 7));
    AsyncCheckpointSaver saver(comm);
    saver.start(root.str(), 20, chunk_shards(full, comm.rank(), 2), kGlobalState, rank_state_of(comm.rank(), 20),
                kPlan, 0);
    try {
      saver.wait();
    } catch (const Error& e) {
      messages[comm.rank()] = e.what();
    }
    EXPECT_FALSE(saver.in_flight());
  });
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &saved_limit), 0);
  std::signal(SIGXFSZ, saved_handler);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + messages[rank]);
    EXPECT_NE(messages[rank].find("checkpoint iter_0000020: the background write"), std::string::npos);
    EXPECT_NE(messages[rank].find("rank_0000" + std::to_string(rank) + ".safetensors"), std::string::npos);
    EXPECT_NE(messages[rank].find("File too large"), std::string::npos);
    EXPECT_NE(messages[rank].find("still names the previous complete checkpoint"), std::string::npos);
  }
  EXPECT_EQ(read_bytes(root / "latest"), "iter_0000010\n");
  EXPECT_FALSE(fs::exists(root / "iter_0000020"));
  expect_reads_back(root.str(), 100, 2);
}

}  // namespace
}  // namespace mmtrain
