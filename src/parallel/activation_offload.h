// Activation offload (features.enable_activation_offload), the step of the parallelize chain after
// recompute: a selected block is recomputed, so all it keeps between forward and backward is its
// input activation; with offload that input goes to the host tier while the forward goes on and
// comes back one block ahead in backward (MindSpeed-MM's async_offload design):
//
//   forward:   block k starts -> block k-1's input is copied to the host, its device memory freed
//   backward:  block k's input is needed -> it is on the device already (prefetched while block
//              k+1 ran backward); block k-1's copy back starts now, to overlap block k's backward
//
// The last selected block's input is never sent (the next block to start would be the first of
// backward). On CUDA the copies run on the side stream (offload/copy_stream.h) from the pinned
// pool, overlapping compute; on CPU they run inline into the host pool, whose bytes are not the
// device allocator's, so the memory profile shows what a GPU would hold. Values are copied, not
// changed: training is bitwise the same as recompute alone.
//
// Without recompute every saved tensor of the block would have to be offloaded, which needs
// saved-tensor hooks for autograd's own nodes; LibTorch gives C++ no way to install them (its
// default hooks are Python's), so that combination is refused by name.
#pragma once
#include "offload/offload_tiers.h"
#include "parallel/recompute.h"

#include <memory>
#include <vector>

namespace mmtrain {

class ActivationOffload : public SavedInputPacker {
 public:
  explicit ActivationOffload(std::shared_ptr<OffloadTiers> tiers);

  c10::intrusive_ptr<PackedInput> pack(const at::Tensor& input) override;

  struct Entry;  // one block input's journey, in forward order

 private:
  friend struct OffloadedInput;
  at::Tensor unpack(Entry& entry);
  void send(Entry& entry);         // device -> host, device memory let go
  void bring_back(Entry& entry);   // host -> device, started

  std::shared_ptr<OffloadTiers> tiers_;
  std::vector<std::shared_ptr<Entry>> entries_;  // this forward's inputs, until backward takes them
};

}  // namespace mmtrain
