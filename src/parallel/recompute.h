// Activation checkpointing (recompute) for one block, as a reentrant autograd Function:
// forward runs without saving activations; backward re-runs the block with grad enabled on
// detached copies of its inputs and backpropagates through that fresh graph (so parameter
// grads, including FSDP's reduce-scatter, happen inside the nested backward).
#pragma once
#include "nn/module.h"

namespace mmtrain {

// forward_fn runs now, under no-grad. recompute_fn runs in backward; it gets the same inputs
// and must compute the same output (it may re-gather parameters first). Both are kept alive by
// the autograd graph, so they must capture by value. Blocks with dropout are not supported:
// the RNG state is not replayed.
at::Tensor checkpoint_block(const std::vector<at::Tensor>& inputs, BlockFn forward_fn,
                            BlockFn recompute_fn);

}  // namespace mmtrain
