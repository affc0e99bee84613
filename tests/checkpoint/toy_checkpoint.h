// A toy model's tensors (every dtype, uneven and empty shards, a 0-dim one) saved and read back
// by the checkpoint tests on thread-per-rank worlds.
#pragma once
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint_test_util.h"
#include "dist/comm.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace mmtrain::testing {

// The full (unsharded) tensors of a toy model. dim 0 of 5 over 2 ranks is 3 + 2 rows, over 4 ranks
// 2 + 2 + 1 + 0; one_row leaves every rank but 0 empty, no_rows leaves all of them empty.
inline std::vector<std::pair<std::string, at::Tensor>> model_tensors(uint64_t seed) {
  return {{"layers.0.weight", random_tensor({5, 3}, at::kFloat, seed)},
          {"embed", random_tensor({7, 4}, at::kBFloat16, seed + 1)},
          {"bias", random_tensor({5}, at::kLong, seed + 2)},
          {"one_row", random_tensor({1, 6}, at::kHalf, seed + 3)},
          {"no_rows", random_tensor({0, 3}, at::kFloat, seed + 4)},
          {"mask", random_tensor({9, 2, 2}, at::kBool, seed + 5)},
          {"step", at::scalar_tensor(static_cast<int64_t>(seed), at::kLong)}};
}

// This rank's torch.chunk shards of `full` (views: the save must cope with non-owning slices).
inline std::vector<ShardedTensor> chunk_shards(const std::vector<std::pair<std::string, at::Tensor>>& full, int rank,
                                        int world) {
  std::vector<ShardedTensor> shards;
  for (const auto& [name, t] : full) {
    if (t.dim() == 0) {
      shards.push_back({name, {}, 0, t});  // every rank passes it; only rank 0's is saved
      continue;
    }
    auto [begin, end] = chunk_rows(t.size(0), world, rank);
    shards.push_back({name, t.sizes().vec(), begin, t.slice(0, begin, end)});
  }
  return shards;
}

inline nlohmann::json rank_state_of(int rank, int64_t iteration) {
  return {{"rank", rank}, {"rng", {{"seed", 1234 + rank}, {"offset", iteration * 7}}}, {"pi", 3.141592653589793}};
}

// Collective save of model_tensors(seed) chunked over comm's world.
// lineage: the trainer_state.json "lineage" ("" writes none, like a checkpoint from before lineages).
inline std::string save_model(const std::string& root, int64_t iteration, Comm& comm, uint64_t seed,
                              const std::string& lineage = "") {
  nlohmann::json global_state = {{"iteration", iteration}, {"consumed_samples", iteration * 8}};
  if (!lineage.empty()) global_state["lineage"] = lineage;
  return checkpoint_save(root, iteration, comm, chunk_shards(model_tensors(seed), comm.rank(), comm.world_size()),
                         global_state,
                         rank_state_of(comm.rank(), iteration),
                         {{"unit", "layers.{*}"}, {"world_size", comm.world_size()}});
}

// Reads every tensor back on `reader_world` threads, each taking its own torch.chunk rows. Readers
// need no Comm: plain threads, each with its own CheckpointReader.
inline void expect_reads_back(const std::string& path, uint64_t seed, int reader_world) {
  const auto full = model_tensors(seed);
  std::vector<std::thread> readers;
  for (int rank = 0; rank < reader_world; ++rank) {
    readers.emplace_back([&, rank] {
      try {
        CheckpointReader reader(path);
        for (const auto& [name, t] : full) {
          ASSERT_TRUE(reader.contains(name)) << name;
          EXPECT_EQ(reader.global_shape(name), t.sizes().vec()) << name;
          EXPECT_EQ(reader.dtype(name), t.scalar_type()) << name;
          EXPECT_TRUE(bitwise_equal(reader.read_full(name), t)) << name;
          if (t.dim() == 0) continue;
          auto [begin, end] = chunk_rows(t.size(0), reader_world, rank);
          EXPECT_TRUE(bitwise_equal(reader.read_rows(name, begin, end), t.slice(0, begin, end).contiguous()))
              << name << " rows [" << begin << ", " << end << ") on reader rank " << rank << " of " << reader_world;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "reader rank " << rank << " of " << reader_world << ": " << e.what();
      }
    });
  }
  for (auto& t : readers) t.join();
}

}  // namespace mmtrain::testing
