// Context-parallel attention against attention over the whole stream: Ulysses 2 and 4 (4 with
// KV heads replicated), ring 2 and 4, hybrid 2 x 2, causal (zigzag) and full, on three packed
// samples of odd lengths whose 37 rows divide by no degree (padding rows). Every rank's output
// rows equal the whole attention's rows, and the CP sum of every rank's input grads equals the
// whole attention's grads, and gathering every rank's rows gives back the whole output. Plus the
// device mesh's groups.
#include "dist/device_mesh.h"
#include "multirank_harness.h"
#include "parallel/context_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace mmtrain {
namespace {

constexpr int64_t kHq = 4, kHkv = 2, kD = 8;
const std::vector<int64_t> kCu = {0, 11, 30, 37};

struct Layout {
  int ring, ulysses;
  bool causal;
};

class ContextParallelAttention : public ::testing::TestWithParam<Layout> {};

TEST_P(ContextParallelAttention, EqualsAttentionOverTheWholeStream) {
  const auto layout = GetParam();
  MeshShape shape;
  shape.ring = layout.ring;
  shape.ulysses = layout.ulysses;
  testing::run_mesh_ranks(shape, [&](const DeviceMesh& mesh) {
    const ContextParallel cp(mesh.ring(), mesh.ulysses(), mesh.cp());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);  // the same stream on every rank
    const int64_t rows = kCu.back();
    auto q = at::randn({rows, kHq, kD}, gen).requires_grad_(true);
    auto k = at::randn({rows, kHkv, kD}, gen).requires_grad_(true);
    auto v = at::randn({rows, kHkv, kD}, gen).requires_grad_(true);
    const auto grad_out = at::randn({rows, kHq, kD}, gen);

    const auto whole = varlen_attention(q, k, v, kCu, layout.causal).out;
    const auto whole_grads = torch::autograd::grad({whole}, {q, k, v}, {grad_out});

    const auto shard = cp.shard(kCu, layout.causal);
    EXPECT_EQ(shard->padded_rows() % (shape.cp() * (layout.causal && layout.ring > 1 ? 2 : 1)), 0);
    const auto out = shard->attention(shard->take(q), shard->take(k), shard->take(v), layout.causal);
    ASSERT_EQ(out.size(0), shard->local_rows());
    EXPECT_LE((out - shard->take(whole.detach())).abs().max().item<double>(), 1e-5) << "rank " << mesh.rank();
    // gather undoes the split (zigzag and padding included): every rank gets the whole output.
    const auto gathered = shard->gather(out.detach());
    EXPECT_LE((gathered - whole.detach()).abs().max().item<double>(), 1e-5) << "rank " << mesh.rank();

    auto grads = torch::autograd::grad({out}, {q, k, v}, {shard->take(grad_out)});
    for (int i = 0; i < 3; ++i) {
      auto total = grads[i].contiguous();
      mesh.cp()->all_reduce_sum(total).wait();
      EXPECT_LE((total - whole_grads[i]).abs().max().item<double>(), 1e-5) << "rank " << mesh.rank() << " grad " << i;
    }
    // The loss sum: every rank gets the total, and its grad stays its own.
    auto local = (out * shard->take(grad_out)).sum();
    auto summed = shard->sum(local);
    EXPECT_NEAR(summed.item<double>(), (whole * grad_out).sum().item<double>(), 1e-3);
  });
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelAttention,
                         ::testing::Values(Layout{1, 2, false}, Layout{1, 2, true}, Layout{1, 4, true},
                                           Layout{2, 1, false}, Layout{2, 1, true}, Layout{4, 1, false},
                                           Layout{4, 1, true}, Layout{2, 2, false}, Layout{2, 2, true}),
                         [](const ::testing::TestParamInfo<Layout>& info) {
                           return "ring" + std::to_string(info.param.ring) + "_ulysses" +
                                  std::to_string(info.param.ulysses) + (info.param.causal ? "_causal" : "_full");
                         });

// The zigzag split: ring rank r holds pieces r and 2R-1-r; padding rows hold the pad value.
TEST(SequenceShard, ZigzagPiecesAndPadding) {
  MeshShape shape;
  shape.ring = 2;
  testing::run_mesh_ranks(shape, [&](const DeviceMesh& mesh) {
    const ContextParallel cp(mesh.ring(), mesh.ulysses(), mesh.cp());
    const auto shard = cp.shard({0, 5, 9}, /*causal=*/true);  // 9 rows -> 12: pieces of 3
    EXPECT_EQ(shard->padded_rows(), 12);
    const std::vector<int64_t> expected = mesh.ring_rank() == 0 ? std::vector<int64_t>{0, 1, 2, 9, 10, 11}
                                                                : std::vector<int64_t>{3, 4, 5, 6, 7, 8};
    EXPECT_EQ(shard->local_index(), expected);
    const auto taken = shard->take(at::arange(9, at::kLong), -1);
    const auto want = mesh.ring_rank() == 0 ? at::tensor(std::vector<int64_t>{0, 1, 2, -1, -1, -1})
                                            : at::tensor(std::vector<int64_t>{3, 4, 5, 6, 7, 8});
    EXPECT_TRUE(at::equal(taken, want));
    EXPECT_EQ(shard->real_mask(at::kCPU).sum().item<int64_t>(), mesh.ring_rank() == 0 ? 3 : 6);
  });
}

// Each group's ranks, checked by summing world ranks over it.
TEST(DeviceMesh, GroupsFollowTheCoordinates) {
  MeshShape shape;
  shape.dp_replicate = 2;
  shape.ring = 2;
  testing::run_mesh_ranks(shape, [&](const DeviceMesh& mesh) {
    const int r = mesh.rank();
    EXPECT_EQ(mesh.replicate_rank(), r / 2);
    EXPECT_EQ(mesh.ring_rank(), r % 2);
    EXPECT_EQ(mesh.dp_rank(), r / 2);
    EXPECT_EQ(mesh.dp_size(), 2);
    auto sum_over = [&](const std::shared_ptr<Comm>& comm) { return comm->all_reduce_sum(static_cast<double>(r)); };
    EXPECT_EQ(mesh.fsdp()->world_size(), 2);
    EXPECT_EQ(sum_over(mesh.fsdp()), r < 2 ? 1 : 5);      // {0, 1} or {2, 3}
    EXPECT_EQ(sum_over(mesh.replicate()), r % 2 ? 4 : 2);  // {1, 3} or {0, 2}
    EXPECT_EQ(sum_over(mesh.ring()), r < 2 ? 1 : 5);
    EXPECT_EQ(mesh.ulysses()->world_size(), 1);
    EXPECT_EQ(sum_over(mesh.cp()), r < 2 ? 1 : 5);
  });
}

}  // namespace
}  // namespace mmtrain
