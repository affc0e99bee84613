#include "multirank_harness.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace mmtrain {
namespace {

class CommTest : public ::testing::TestWithParam<int> {};

// Rank r's values of part i: distinct per rank, part and element, with fractions that make the
// order of a sum visible in its last bits.
at::Tensor rank_values(int rank, int part, int64_t n) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * rank + part);
  return at::randn({n}, gen) * 1e3;
}

TEST_P(CommTest, InPlaceAllGatherFillsEveryRanksBlockOfEachTensor) {
  const int world = GetParam();
  testing::run_ranks(world, [&](Comm& comm) {
    const std::vector<int64_t> sizes = {3, 5, 1};
    std::vector<at::Tensor> outs;
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto out = at::full({world * sizes[i]}, NAN);
      out.narrow(0, comm.rank() * sizes[i], sizes[i]).copy_(rank_values(comm.rank(), i, sizes[i]));
      outs.push_back(out);
    }
    comm.all_gather_in_place(outs).wait();
    for (size_t i = 0; i < sizes.size(); ++i)
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(at::equal(outs[i].narrow(0, r * sizes[i], sizes[i]), rank_values(r, i, sizes[i])))
            << "part " << i << ", rank " << r << "'s block";
  });
}

TEST_P(CommTest, BlockReduceScatterSumsEachRanksBlockInRankOrder) {
  const int world = GetParam();
  testing::run_ranks(world, [&](Comm& comm) {
    // Part 0: blocks are slices of one flat tensor (a grad sent where it lies); part 1: rows of a
    // [W, n] tensor (a staged grad). Every rank expects the rank-order sum of its own blocks, in
    // the dtype of the blocks (bf16: a reduce_dtype of bf16 rounds after every add).
    const std::vector<int64_t> sizes = {4, 7};
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      auto values_of = [&](int rank, size_t part) { return rank_values(rank, part, world * sizes[part]).to(dtype); };
      std::vector<at::Tensor> outs;
      std::vector<std::vector<at::Tensor>> blocks(sizes.size());
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto values = values_of(comm.rank(), i);
        auto rows = i == 0 ? values : values.view({world, sizes[i]}).contiguous();
        for (int q = 0; q < world; ++q)
          blocks[i].push_back(i == 0 ? rows.narrow(0, q * sizes[i], sizes[i]) : rows.view({world, sizes[i]})[q]);
        outs.push_back(at::empty({sizes[i]}, dtype));
      }
      TensorPool scratch(2);
      comm.reduce_scatter_sum_blocks(outs, blocks, &scratch).wait();
      for (size_t i = 0; i < sizes.size(); ++i) {
        auto mine = [&](int r) { return values_of(r, i).narrow(0, comm.rank() * sizes[i], sizes[i]); };
        auto expected = mine(0).clone();
        for (int r = 1; r < world; ++r) expected += mine(r);
        EXPECT_TRUE(at::equal(outs[i], expected)) << dtype << " part " << i << ": " << outs[i] << " vs " << expected;
      }
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
