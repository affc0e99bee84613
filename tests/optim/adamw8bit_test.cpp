// The 8-bit AdamW (optim/adamw8bit.h) on its own: its state bytes are what the planner says
// (state_bytes_for) on every rank of a layout with blocks straddling ranks; a block whose parts
// sit on two ranks gets one absmax on both; a bad layout is refused naming the param. Its update
// against bitsandbytes is tests/parity/test_adamw8bit_bnb.py.
#include "optim/adamw8bit.h"

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
