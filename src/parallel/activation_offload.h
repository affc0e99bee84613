// Activation offload (features.enable_activation_offload), the step of the parallelize chain after
// recompute: what a selected block keeps for its backward goes to the host tier while the forward
// goes on, and comes back one block ahead in backward (MindSpeed-MM's async_offload design):
//
//   forward:   block k starts -> what block k-1 kept is copied to the host, its device memory freed
//   backward:  block k's first saved tensor is needed -> block k's tensors come back (most already
//              prefetched while block k+1 ran backward), and block k-1's return starts now, to
//              overlap block k's backward
//
// What a block keeps depends on recompute:
//   - a recomputed block keeps only its input activation (recompute's SavedInputPacker, pack());
//   - a block that is not recomputed keeps every tensor autograd saves inside it: LibTorch's
//     saved-tensor hooks (SavedVariableHooks) catch those. Its default hooks come from the
//     process's autograd Engine, which C++ may replace (set_default_engine_stub): mmtrain installs
//     an Engine whose only difference is that, while a selected block runs forward on this
//     thread, every tensor autograd saves is handed to this offload. Leaves (parameters, buffers,
//     batch inputs: held elsewhere, so moving them frees nothing), FSDP's gathered parameters
//     (their buffers are freed and re-gathered by FSDP itself) and non-float tensors stay put.
//
// The last selected block's tensors are never sent (the next block to start would be the first of
// backward). On CUDA the copies run on the side stream (offload/copy_stream.h) from the pinned
// pool, overlapping compute; on CPU they run inline into the host pool, whose bytes are not the
// device allocator's, so the memory profile shows what a GPU would hold. Values are copied, not
// changed: training is bitwise the same as without offload.
#pragma once
#include "nn/module.h"
#include "offload/offload_tiers.h"
#include "parallel/recompute.h"

#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

namespace mmtrain {

class ActivationOffload : public SavedInputPacker, public std::enable_shared_from_this<ActivationOffload> {
 public:
  explicit ActivationOffload(std::shared_ptr<OffloadTiers> tiers);

  // Recompute's packer: a recomputed block starts with its input.
  c10::intrusive_ptr<PackedInput> pack(const at::Tensor& input) override;

  // A block hook for blocks that are not recomputed: every tensor autograd saves while the block
  // runs forward (with grad) is offloaded. Installs the hooking Engine on first use.
  std::shared_ptr<BlockHook> saved_tensor_hook();
  // Tensors the saved-tensor hook must leave where they are (FSDP's gathered parameters), set
  // once the FSDP engine exists.
  void set_keep_in_place(std::function<bool(const at::Tensor&)> keep) { keep_in_place_ = std::move(keep); }

  struct Entry;  // one offloaded tensor's journey

  // Used by the handles that hold the entries (the packer's PackedInput, the saved-tensor hooks).
  void begin_block();  // a selected block starts its forward: the previous block's tensors leave
  std::shared_ptr<Entry> add(const at::Tensor& t);
  at::Tensor unpack(Entry& entry);
  bool keep_in_place(const at::Tensor& t) const;

 private:
  void send(Entry& entry);         // device -> host, device memory let go
  void bring_back(Entry& entry);   // host -> device, started
  void bring_back_block(size_t block);

  std::shared_ptr<OffloadTiers> tiers_;
  std::function<bool(const at::Tensor&)> keep_in_place_;
  // Per selected block of the current forward, in order: its entries, owned by their handles
  // (which die with the autograd graph).
  std::vector<std::vector<std::weak_ptr<Entry>>> blocks_;
  // The running block's entries by tensor (the entry holds the tensor, so no address is reused).
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<Entry>> in_block_;
};

}  // namespace mmtrain
