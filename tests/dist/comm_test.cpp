#include "multirank_harness.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

class CommTest : public ::testing::TestWithParam<int> {};

TEST_P(CommTest, AllGatherConcatenatesInRankOrder) {
  const int world = GetParam();
  testing::run_ranks(world, [&](Comm& comm) {
    auto in = at::full({3}, static_cast<float>(comm.rank() + 1));
    auto out = at::empty({3 * world});
    comm.all_gather_into(out, in).wait();
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(out.slice(0, 3 * r, 3 * r + 3).eq(r + 1).all().item<bool>()) << "rank block " << r;
  });
}

TEST_P(CommTest, ReduceScatterSumsEachBlock) {
  const int world = GetParam();
  testing::run_ranks(world, [&](Comm& comm) {
    // in[j] = (rank + 1) * j ; sum over ranks of block `rank` = S * j, S = W(W+1)/2.
    auto in = at::arange(4 * world, at::kFloat) * static_cast<float>(comm.rank() + 1);
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      auto out = at::empty({4}, dtype);
      comm.reduce_scatter_sum(out, in.to(dtype)).wait();
      auto expected = at::arange(4 * comm.rank(), 4 * comm.rank() + 4, at::kFloat) *
                      static_cast<float>(world * (world + 1) / 2);
      EXPECT_TRUE(at::allclose(out.to(at::kFloat), expected, 1e-2, 0)) << out;
    }
  });
}

TEST_P(CommTest, AllReduceAllToAllBroadcastBarrier) {
  const int world = GetParam();
  testing::run_ranks(world, [&](Comm& comm) {
    EXPECT_DOUBLE_EQ(comm.all_reduce_sum(comm.rank() + 0.5), world * (world - 1) / 2.0 + 0.5 * world);
    // all_to_all: block j of rank r holds 100*r + j; afterwards block j holds 100*j + rank.
    auto in = at::arange(world, at::kFloat) + 100.0f * comm.rank();
    auto out = at::empty_like(in);
    comm.all_to_all(out, in).wait();
    auto expected = at::arange(world, at::kFloat) * 100.0f + comm.rank();
    EXPECT_TRUE(at::equal(out, expected)) << out;
    auto b = at::full({2}, static_cast<float>(comm.rank()));
    comm.broadcast(b, world - 1).wait();
    EXPECT_TRUE(b.eq(world - 1).all().item<bool>());
    comm.barrier();
  });
}

TEST(CommTest, SendRecvRing) {
  testing::run_ranks(3, [&](Comm& comm) {
    const int next = (comm.rank() + 1) % 3, prev = (comm.rank() + 2) % 3;
    auto out = at::full({2}, static_cast<float>(comm.rank()));
    auto in = at::empty({2});
    auto send = comm.send(out, next, 7);
    comm.recv(in, prev, 7).wait();
    send.wait();
    EXPECT_TRUE(in.eq(prev).all().item<bool>());
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommTest, ::testing::Values(1, 2, 4));

}  // namespace
}  // namespace mmtrain
