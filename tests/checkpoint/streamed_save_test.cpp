// A streamed save (ShardedTensor::fetch instead of local, what `convert dcp-to-ckpt` uses to write
// checkpoints larger than memory) writes the very bytes an in-memory save writes, asking for each
// tensor twice (checksum pass, write pass) and never holding two at once.
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/toy_checkpoint.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

TEST(StreamedSave, WritesWhatAnInMemorySaveWritesOneTensorAtATime) {
  testing::TempDir in_memory, streamed;
  Comm comm(nullptr, 0, 1);
  const auto full = testing::model_tensors(11);
  const nlohmann::json global = {{"iteration", 3}}, plan = {{"unit", "all"}};
  checkpoint_save(in_memory.str(), 3, comm, testing::chunk_shards(full, 0, 1), global, testing::rank_state_of(0, 3), plan);

  std::map<std::string, int> fetches;
  int alive = 0, most_alive = 0;
  std::vector<ShardedTensor> lazy;
  for (auto& t : testing::chunk_shards(full, 0, 1)) {
    const at::Tensor value = t.local.clone();
    t.local = at::Tensor();
    t.fetch = [&, name = t.name, value] {
      ++fetches[name];
      // Each fetched tensor carries a deleter-counted copy, so the test sees how many are alive.
      ++alive;
      most_alive = std::max(most_alive, alive);
      at::Tensor copy = value.clone();
      auto* counter = &alive;
      return at::from_blob(copy.data_ptr(), copy.sizes(), [copy, counter](void*) mutable { --*counter; },
                           copy.options());
    };
    lazy.push_back(std::move(t));
  }
  checkpoint_save(streamed.str(), 3, comm, lazy, global, testing::rank_state_of(0, 3), plan);

  for (const char* file : {"iter_0000003/rank_00000.safetensors", "iter_0000003/index.json"})
    EXPECT_EQ(testing::read_bytes(streamed / file), testing::read_bytes(in_memory / file)) << file;
  for (const auto& [name, count] : fetches) EXPECT_EQ(count, 2) << name;
  EXPECT_EQ(most_alive, 1);
  EXPECT_EQ(alive, 0);
}

}  // namespace
}  // namespace mmtrain
