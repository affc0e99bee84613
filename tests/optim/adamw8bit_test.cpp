// The 8-bit AdamW (optim/adamw8bit.h) on its own: its state bytes are what the planner says
// (state_bytes_for) on every rank of a layout with blocks straddling ranks; a block whose parts
// sit on two ranks gets one absmax on both; a bad layout is refused naming the param; with its
// state on the disk tier it steps bitwise like in memory. Its update against bitsandbytes is
// tests/parity/test_adamw8bit_bnb.py.
#include "optim/adamw8bit.h"

#include "checkpoint/checkpoint_test_util.h"
#include "quant/dynamic_map.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

// Two params over W ranks, row-sharded like FSDP: rows of 100 and of 24 elements.
struct Layout {
  std::vector<ShardedParamSpan> spans;
  int64_t shard_numel = 0;
};

Layout layout_for(int world, int rank) {
  Layout out;
  for (auto [name, rows, row_numel] : {std::tuple{"proj", 37, 100}, std::tuple{"norm", 3, 8}}) {
    const int64_t padded = (rows + world - 1) / world;
    ShardedParamSpan span{name, out.shard_numel, int64_t{rows} * row_numel, {}};
    for (int r = 0; r < world; ++r) span.rank_begins.push_back(std::min<int64_t>(r * padded, rows) * row_numel);
    span.rank_begins.push_back(span.numel);
    out.shard_numel += padded * row_numel;
    (void)rank;
    out.spans.push_back(std::move(span));
  }
  return out;
}

TEST(AdamW8bit, StateBytesAreThePlannersOnEveryRank) {
  for (int world : {1, 2, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      const Layout l = layout_for(world, rank);
      AdamW8bit optimizer({at::zeros({l.shard_numel})}, {at::zeros({l.shard_numel})}, {l.spans}, rank,
                          AdamW8bitOptions{AdamWOptions{}, 256}, [](at::Tensor&) {});
      EXPECT_EQ(optimizer.state_bytes(), AdamW8bit::state_bytes_for(l.shard_numel, l.spans, rank, 256))
          << "world " << world << " rank " << rank;
    }
  }
  // 1 rank: 2 bytes of codes per element, 2 absmax per block of proj (15 blocks), norm's 24 in fp32.
  const Layout one = layout_for(1, 0);
  EXPECT_EQ(AdamW8bit::state_bytes_for(one.shard_numel, one.spans, 0, 256), 2 * 3724 + 8 * 15 + 8 * 24);
}

// Rank 0 of 2 holds proj's rows 0..18 (elements 0..1899): its last block (7: 1792..2047) straddles
// into rank 1. The exchange gives it the max over both parts; here the other rank's part is larger.
TEST(AdamW8bit, StraddlingBlockTakesTheMaxOverRanks) {
  const Layout l = layout_for(2, 0);
  at::Tensor params = at::zeros({l.shard_numel}), grads = at::full({l.shard_numel}, 0.5f);
  int exchanges = 0;
  AdamW8bit optimizer({params}, {grads}, {l.spans}, 0, AdamW8bitOptions{AdamWOptions{}, 256}, [&](at::Tensor& absmax) {
    ++exchanges;
    ASSERT_EQ(absmax.numel(), 2);  // one straddling block, exp_avg and exp_avg_sq
    absmax.fill_(7.0f);            // the other rank's part: larger
  });
  optimizer.step(1e-3);
  EXPECT_EQ(exchanges, 1);
  const at::Tensor absmax = optimizer.absmax(0, "proj", 0);
  ASSERT_EQ(optimizer.first_block(0, "proj"), 0);
  ASSERT_EQ(absmax.numel(), 8);
  EXPECT_FLOAT_EQ(absmax[0].item<float>(), 0.05f);  // m = (1 - 0.9) * 0.5, a block of its own
  EXPECT_FLOAT_EQ(absmax[7].item<float>(), 7.0f);
  // The straddling block's codes: 0.05 / 7 on the signed map (whose entries near 0.007 are about 5 %
  // apart), the others 0.05 / 0.05 = 1.
  const at::Tensor codes = optimizer.codes(0, "proj", 0);
  const at::Tensor map = quant::dynamic_map(quant::DynamicMap::signed_values);
  EXPECT_FLOAT_EQ(map[codes[0].item<uint8_t>()].item<float>(), 1.0f);
  EXPECT_NEAR(map[codes[1850].item<uint8_t>()].item<float>() * 7.0f, 0.05f, 0.05f * 0.05f);
  EXPECT_EQ(optimizer.owned_blocks(0, "proj"), std::make_pair(int64_t{0}, int64_t{8}));
}

// Three units (the second of frozen params only, no spans) as rank 0 of 2, so that blocks straddle:
// with the state on disk, a unit at a time in RAM and the straddling blocks settled per unit,
// three steps leave the weights, codes and absmax bitwise those of the in-memory optimizer.
TEST(AdamW8bit, OnTheDiskTierStepsBitwiseLikeInMemory) {
  const Layout l = layout_for(2, 0);
  const std::vector<std::vector<ShardedParamSpan>> spans = {l.spans, {}, l.spans};
  testing::TempDir dir;
  auto disk = std::make_shared<DiskStore>(dir.str(), 0);
  struct Arm {
    std::vector<at::Tensor> params, grads;
    std::unique_ptr<AdamW8bit> optimizer;
    int exchanges = 0;
  };
  Arm memory, paged;
  for (Arm* arm : {&memory, &paged}) {
    at::manual_seed(3);
    for (const auto& unit : spans) {
      const int64_t numel = unit.empty() ? 0 : l.shard_numel;
      arm->params.push_back(at::randn({numel}));
      arm->grads.push_back(at::zeros({numel}));
    }
    // The other rank's parts of the straddling blocks: a fixed floor, the same for both arms.
    auto exchange = [arm](at::Tensor& absmax) {
      ++arm->exchanges;
      absmax.clamp_min_(0.02f);
    };
    arm->optimizer = std::make_unique<AdamW8bit>(arm->params, arm->grads, spans, 0,
                                                 AdamW8bitOptions{AdamWOptions{0.9, 0.999, 1e-8, 0.01}, 256}, exchange,
                                                 nullptr, arm == &paged ? disk : nullptr);
  }
  for (int step = 0; step < 3; ++step) {
    at::manual_seed(10 + step);
    for (size_t u = 0; u < spans.size(); ++u) {
      const at::Tensor grad = at::randn({memory.grads[u].numel()});
      memory.grads[u].copy_(grad);
      paged.grads[u].copy_(grad);
    }
    memory.optimizer->step(1e-2);
    paged.optimizer->step(1e-2);
  }
  EXPECT_EQ(memory.exchanges, 3);  // one per step
  EXPECT_EQ(paged.exchanges, 6);   // one per step and unit that trains
  for (size_t u : {size_t{0}, size_t{2}}) {
    EXPECT_TRUE(at::equal(memory.params[u], paged.params[u])) << "unit " << u;
    paged.optimizer->keep_resident(u, /*changing=*/false);
    for (int m = 0; m < 2; ++m) {
      EXPECT_TRUE(at::equal(memory.optimizer->codes(u, "proj", m), paged.optimizer->codes(u, "proj", m)));
      EXPECT_TRUE(at::equal(memory.optimizer->absmax(u, "proj", m), paged.optimizer->absmax(u, "proj", m)));
      EXPECT_TRUE(at::equal(memory.optimizer->moment(u, "norm", m), paged.optimizer->moment(u, "norm", m)));
    }
  }
  paged.optimizer->release();
  EXPECT_CONTAINS(testing::error_of([&] { paged.optimizer->codes(0, "proj", 0); }),
                  "unit 0's state is on disk (training.offload_dir); keep_resident(0) brings it in");
  EXPECT_EQ(paged.optimizer->state_bytes(), 2 * paged.optimizer->largest_unit_state_bytes());
  EXPECT_EQ(paged.optimizer->total_state_bytes(), memory.optimizer->state_bytes());
  // A checkpoint load's writes reach the disk: set, let go, read back.
  paged.optimizer->keep_resident(2, /*changing=*/true);
  paged.optimizer->absmax(2, "proj", 1).fill_(0.5f);
  paged.optimizer->keep_resident(0, /*changing=*/false);  // unit 2 goes back written
  paged.optimizer->keep_resident(2, /*changing=*/false);
  EXPECT_TRUE(at::equal(paged.optimizer->absmax(2, "proj", 1), at::full({8}, 0.5f)));
}

TEST(AdamW8bit, RefusesALayoutThatDoesNotAddUp) {
  Layout l = layout_for(2, 0);
  l.spans[0].rank_begins.back() = 10;  // not its numel
  EXPECT_CONTAINS(testing::error_of([&] {
                    AdamW8bit({at::zeros({l.shard_numel})}, {at::zeros({l.shard_numel})}, {l.spans}, 0,
                              AdamW8bitOptions{}, [](at::Tensor&) {});
                  }),
                  "param 'proj': rank_begins must rise from 0 to its 3700 elements");
}

}  // namespace
}  // namespace mmtrain
