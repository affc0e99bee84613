// Every Comm collective on the run's device (tests/device/run_device.h) in a one-rank group with a
// real backend (runtime_init gives one rank no backend at all): on CUDA that is NCCL, whose
// collectives run even for one rank (dist/comm.h), so a one-GPU machine checks Comm's NCCL path:
// the coalesced all-gather, the packed reduce-scatter, all-reduce sum and max, all-to-all,
// broadcast, barrier, and the scalar helpers. With one rank each result is known exactly. Send and
// receive need a peer; the multi-rank tests (tests/dist/comm_test.cpp) cover them on Gloo.
#include "dist/comm.h"
#include "dist/runtime.h"
#include "run_device.h"

#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

namespace mmtrain {
namespace {

TEST(DeviceComm, EveryCollectiveOfOneRankOnTheRunsDevice) {
  const at::Device device = testing::run_device();
  auto store = c10::make_intrusive<c10d::HashStore>();
  Comm comm(make_backend(store, 0, 1, default_device(), std::chrono::seconds(60)), 0, 1, device);
  const bool nccl = device.is_cuda();
  EXPECT_EQ(comm.backend()->getBackendName(), nccl ? "nccl" : "gloo");
  const auto on_device = at::TensorOptions().device(device);

  // All-gather in place of two tensors: one rank's block is the whole tensor, unchanged.
  std::vector<at::Tensor> outs = {at::arange(5, on_device.dtype(at::kFloat)), at::arange(3, on_device.dtype(at::kFloat)) * 0.5};
  const std::vector<at::Tensor> before = {outs[0].clone(), outs[1].clone()};
  comm.all_gather_in_place(outs).wait();
  for (size_t i = 0; i < outs.size(); ++i) EXPECT_TRUE(at::equal(outs[i], before[i])) << "all-gather " << i;

  // Reduce-scatter of blocks: out <- the one rank's block.
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto block = (at::arange(7, on_device.dtype(at::kFloat)) * 0.25).to(dtype);
    std::vector<at::Tensor> reduced = {at::empty({7}, on_device.dtype(dtype))};
    comm.reduce_scatter_sum_blocks(reduced, {{block}}).wait();
    EXPECT_TRUE(at::equal(reduced[0], block)) << "reduce-scatter " << dtype;
  }

  auto sum = at::full({4}, 1.5, on_device.dtype(at::kFloat));
  comm.all_reduce_sum(sum).wait();
  EXPECT_TRUE(sum.eq(1.5).all().item<bool>()) << "all-reduce sum";
  auto max = at::full({4}, -2.0, on_device.dtype(at::kFloat));
  comm.all_reduce_max(max).wait();
  EXPECT_TRUE(max.eq(-2.0).all().item<bool>()) << "all-reduce max";

  auto in = at::arange(6, on_device.dtype(at::kFloat)), out = at::zeros({6}, on_device.dtype(at::kFloat));
  comm.all_to_all(out, in).wait();
  EXPECT_TRUE(at::equal(out, in)) << "all-to-all";

  auto root = at::full({3}, 7.0, on_device.dtype(at::kFloat));
  comm.broadcast(root, 0).wait();
  EXPECT_TRUE(root.eq(7.0).all().item<bool>()) << "broadcast";
  comm.barrier();

  EXPECT_DOUBLE_EQ(comm.all_reduce_sum(2.5), 2.5);
  EXPECT_EQ(comm.all_reduce_max(std::vector<double>{1.0, -3.0}), (std::vector<double>{1.0, -3.0}));
  EXPECT_TRUE(comm.any_rank(true));
  EXPECT_FALSE(comm.any_rank(false));
  // NCCL ran every collective above; one Gloo rank has nothing to exchange.
  if (nccl) EXPECT_GE(comm.collectives_issued(), 9);
  else EXPECT_EQ(comm.collectives_issued(), 0);
}

}  // namespace
}  // namespace mmtrain
