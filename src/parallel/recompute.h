// Activation recompute (activation checkpointing), the first step of the parallelize chain: a
// selected block runs its forward without keeping activations; in backward it runs again with
// grad on detached copies of its inputs (BlockPass::recompute) and that fresh graph
// backpropagates at once, inside the outer backward. Hooks inside this one (FSDP) see the
// recompute pass and gather what it needs. This is the reentrant form; blocks with dropout are
// not supported (the RNG state is not replayed).
//
// What a recomputed block keeps between its forward and its backward is its inputs. A
// SavedInputPacker decides how the activations among them (floating tensors that require grad)
// are held meanwhile: pack() in forward, unpack() in backward, like torch's saved-tensor hooks
// scoped to these inputs. Activation offload (parallel/activation_offload.h) is such a packer.
#pragma once
#include "nn/module.h"

#include <ATen/core/custom_class.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

namespace mmtrain {

// One packed input: gives the tensor back in backward (once).
struct PackedInput : torch::CustomClassHolder {
  virtual at::Tensor unpack() = 0;
};

struct SavedInputPacker {
  virtual ~SavedInputPacker() = default;
  virtual c10::intrusive_ptr<PackedInput> pack(const at::Tensor& input) = 0;
};

// Installs the recompute hook on every block matching patterns (module patterns such as
// "layers.{*}"); the blocks in `packed` hold their activation inputs through packer. Fails naming
// the pattern when one matches no module, or the module when a match is not a block.
void apply_recompute(Module& model, const std::vector<std::string>& patterns,
                     std::shared_ptr<SavedInputPacker> packer = nullptr, const std::set<const Module*>& packed = {});

}  // namespace mmtrain
