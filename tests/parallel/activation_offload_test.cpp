// Activation offload's schedule on CPU (parallel/activation_offload.h), block inputs packed in
// forward order and unpacked in reverse: a block's input leaves for the host tier when the next
// block is packed (its device memory freed), the last one never leaves, and unpacking block k
// brings it back and starts block k - 1's return; every value comes back bitwise.
#include "parallel/activation_offload.h"

#include "checkpoint/checkpoint_test_util.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

namespace mmtrain {
namespace {

TEST(ActivationOffload, SendsEachInputWhenTheNextBlockStartsAndPrefetchesOneAhead) {
  auto tiers = OffloadTiers::make(at::kCPU);
  auto offload_owner = std::make_shared<ActivationOffload>(tiers);
  ActivationOffload& offload = *offload_owner;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  constexpr int kBlocks = 4;
  constexpr int64_t kBytes = 8 * 512 * 4;  // [8, 512] fp32: two pages each
  std::vector<at::Tensor> expected;
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> device_memory;
  std::vector<c10::intrusive_ptr<PackedInput>> packed;
  for (int k = 0; k < kBlocks; ++k) {
    at::Tensor input = at::randn({8, 512}, gen).requires_grad_(true);
    expected.push_back(input.detach().clone());
    device_memory.emplace_back(input.storage().getWeakStorageImpl());
    packed.push_back(offload.pack(input));
    // Block k starts: block k - 1's input is on the host and its device memory gone.
    EXPECT_EQ(tiers->host_pool->held_bytes(), k * kBytes) << "block " << k;
    EXPECT_EQ(tiers->stats->snapshot().to_host_bytes, k * kBytes);
    if (k > 0) EXPECT_TRUE(device_memory[k - 1].expired()) << "block " << k - 1;
  }
  EXPECT_FALSE(device_memory[kBlocks - 1].expired());  // the last block's input stays

  // Backward, last block first.
  at::Tensor last = packed[kBlocks - 1]->unpack();
  EXPECT_TRUE(testing::bitwise_equal(last, expected[kBlocks - 1]));
  EXPECT_EQ(tiers->stats->snapshot().to_device_bytes, kBytes);  // block kBlocks - 2 prefetched
  EXPECT_EQ(tiers->host_pool->held_bytes(), (kBlocks - 1) * kBytes);  // its host copy goes once it is taken
  for (int k = kBlocks - 2; k >= 0; --k) {
    at::Tensor back = packed[k]->unpack();
    EXPECT_TRUE(testing::bitwise_equal(back, expected[k])) << "block " << k;
    EXPECT_EQ(tiers->host_pool->held_bytes(), k * kBytes) << "block " << k;  // blocks 0 .. k - 1 still there
    // Brought back: block k, and block k - 1 already on its way.
    EXPECT_EQ(tiers->stats->snapshot().to_device_bytes, (kBlocks - k - 1 + (k > 0 ? 1 : 0)) * kBytes);
  }
  EXPECT_EQ(tiers->host_pool->held_bytes(), 0);

  // The next forward starts a new list: nothing of the last one is sent again.
  const int64_t sent = tiers->stats->snapshot().to_host_bytes;
  auto again = offload.pack(at::ones({4}).requires_grad_(true));
  EXPECT_EQ(tiers->stats->snapshot().to_host_bytes, sent);
  EXPECT_TRUE(testing::bitwise_equal(again->unpack(), at::ones({4})));
}

// The message of the c10::Error (autograd's kind) fn throws; "" if none.
std::string autograd_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "";
}

// Two blocks under the saved-tensor hook (activation offload without recompute): each saves its
// input x_k (a non-leaf: offloaded) for sin's backward; block 1 starting sends block 0's to the host.
struct TwoOffloadedBlocks {
  std::shared_ptr<ActivationOffload> offload = std::make_shared<ActivationOffload>(OffloadTiers::make(at::kCPU));
  std::shared_ptr<BlockHook> hook = offload->saved_tensor_hook();
  at::Tensor w = at::linspace(0.1, 1.6, 16).reshape({4, 4}).requires_grad_(true);
  std::vector<at::Tensor> inputs;  // x_k = w * (k + 1)

  at::Tensor forward() {
    at::Tensor out = at::zeros({});
    for (int k = 0; k < 2; ++k) {
      inputs.push_back(w * (k + 1.0));
      const BlockNext block = [](const std::vector<at::Tensor>& in, BlockPass) { return in[0].sin().sum(); };
      out = out + hook->run({inputs.back()}, BlockPass::forward, block);
    }
    return out;
  }
};

// Stock autograd refuses a backward through a tensor changed in place after it was saved; its
// saved-tensor hooks skip that check. Activation offload restores it: the same error, even for a
// tensor that is on the host tier when it is changed.
TEST(ActivationOffload, AnInPlaceChangeToASavedTensorIsRefusedLikeAutograd) {
  {  // unchanged: backward runs, and the gradient is sin's
    TwoOffloadedBlocks blocks;
    blocks.forward().backward();
    const auto expected = blocks.inputs[0].detach().cos() + 2 * blocks.inputs[1].detach().cos();
    EXPECT_TRUE(at::allclose(blocks.w.grad(), expected, 1e-6, 1e-6));
  }
  {  // x_0 (offloaded to the host tier by now) changed in place after it was saved
    TwoOffloadedBlocks blocks;
    at::Tensor loss = blocks.forward();
    {
      at::NoGradGuard no_grad;  // a plain in-place write, as an optimizer or a buggy hook would make
      blocks.inputs[0].mul_(3);
    }
    const std::string message = autograd_error_of([&] { loss.backward(); });
    EXPECT_NE(message.find("modified by an inplace operation"), std::string::npos) << message;
    EXPECT_NE(message.find("is at version 1; expected version 0"), std::string::npos) << message;
  }
  {  // the reference: stock autograd, no hooks, says the same
    at::Tensor w = at::ones({4}).requires_grad_(true);
    at::Tensor x = w * 2, y = x.sin().sum();
    {
      at::NoGradGuard no_grad;
      x.mul_(3);
    }
    const std::string message = autograd_error_of([&] { y.backward(); });
    EXPECT_NE(message.find("modified by an inplace operation"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace mmtrain
