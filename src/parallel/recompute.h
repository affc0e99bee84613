// Activation recompute (activation checkpointing), the first step of the parallelize chain: a
// selected block runs its forward without keeping activations; in backward it runs again with
// grad on detached copies of its inputs (BlockPass::recompute) and that fresh graph
// backpropagates at once, inside the outer backward. Hooks inside this one (FSDP) see the
// recompute pass and gather what it needs. This is the reentrant form; blocks with dropout are
// not supported (the RNG state is not replayed).
#pragma once
#include "nn/module.h"

#include <string>
#include <vector>

namespace mmtrain {

// Installs the recompute hook on every block matching patterns (module patterns such as
// "layers.{*}"). Fails naming the pattern when one matches no module, or the module when a
// match is not a block.
void apply_recompute(Module& model, const std::vector<std::string>& patterns);

}  // namespace mmtrain
