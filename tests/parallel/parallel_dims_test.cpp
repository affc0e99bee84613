// parallel_dims: auto resolution, the mesh it gives, and which sample stream each rank reads
// (the rank layout of dist/device_mesh.h: Ulysses fastest, then ring, shard, replicate).
#include "parallel/parallel_dims.h"

#include "test_util.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

TEST(ParallelDims, AutoIsTheWholeWorld) {
  const auto dims = parallel_dims(ParallelConfig{}, 6, "");
  EXPECT_EQ(dims.fsdp(), 6);
  EXPECT_EQ(dims.dp(), 6);
  EXPECT_EQ(dims.dp_replicate, 1);
  EXPECT_EQ(dims.mesh().world(), 6);
}

TEST(ParallelDims, HsdpWithHybridContextParallel) {
  ParallelConfig p;
  p.fully_shard_parallel_size = 8;  // 2 replicas of 8 = dp_shard 2 x ring 2 x ulysses 2
  p.ring_attention_size = 2;
  p.ulysses_parallel_size = 2;
  const auto dims = parallel_dims(p, 16, "config x.yaml: ");
  EXPECT_EQ(dims.dp_replicate, 2);
  EXPECT_EQ(dims.dp_shard, 2);
  EXPECT_EQ(dims.cp(), 4);
  EXPECT_EQ(dims.dp(), 4);
  const MeshShape mesh = dims.mesh();
  EXPECT_EQ(mesh.world(), 16);
  for (int rank = 0; rank < 16; ++rank) EXPECT_EQ(mesh.dp_rank_of(rank), rank / 4) << rank;  // 4 CP ranks per stream

  p.data_parallel_size = 8;
  EXPECT_CONTAINS(testing::error_of([&] { parallel_dims(p, 16, "config x.yaml: "); }),
                  "config x.yaml: parallel.data_parallel_size: expected auto or world size / (tensor_parallel_size * "
                  "ulysses_parallel_size * ring_attention_size) = 4, found 8");
}

}  // namespace
}  // namespace mmtrain
