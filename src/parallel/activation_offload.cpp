#include "parallel/activation_offload.h"

#include <ATen/record_function.h>

#include <utility>

namespace mmtrain {

struct ActivationOffload::Entry {
  size_t index = 0;        // position in forward order
  at::Tensor device;       // on the device: until sent, and again once brought back
  at::Tensor host;         // in the host pool: from send until brought back
  CopyEvent copy;          // the last copy started for it
  bool taken = false;      // backward has it
};

struct OffloadedInput : PackedInput {
  ActivationOffload* offload;
  std::shared_ptr<ActivationOffload::Entry> entry;

  OffloadedInput(ActivationOffload* o, std::shared_ptr<ActivationOffload::Entry> e)
      : offload(o), entry(std::move(e)) {}
  at::Tensor unpack() override { return offload->unpack(*entry); }
};

ActivationOffload::ActivationOffload(std::shared_ptr<OffloadTiers> tiers) : tiers_(std::move(tiers)) {}

c10::intrusive_ptr<PackedInput> ActivationOffload::pack(const at::Tensor& input) {
  // A forward after the last one's backward took everything starts a new list.
  bool all_taken = true;
  for (const auto& e : entries_) all_taken = all_taken && e->taken;
  if (all_taken) entries_.clear();
  // This block starts: the previous block's input leaves the device.
  if (!entries_.empty() && entries_.back()->device.defined() && !entries_.back()->taken) send(*entries_.back());
  auto entry = std::make_shared<Entry>();
  entry->index = entries_.size();
  entry->device = input;
  entries_.push_back(entry);
  return c10::make_intrusive<OffloadedInput>(this, entry);
}

void ActivationOffload::send(Entry& entry) {
  RECORD_USER_SCOPE("offload::activation_to_host");
  entry.host = tiers_->host_pool->take(entry.device.sizes(), entry.device.scalar_type());
  entry.copy = tiers_->copies->to_host(entry.host, entry.device);
  // The copy stream holds the device memory until the copy is done (CopyStream marks it used),
  // so the training side can let go of it now.
  entry.device = at::Tensor();
}

void ActivationOffload::bring_back(Entry& entry) {
  if (entry.device.defined() || !entry.host.defined()) return;  // on the device already
  RECORD_USER_SCOPE("offload::activation_to_device");
  entry.copy.wait();  // its trip to the host finished
  entry.device = at::empty(entry.host.sizes(), entry.host.options().device(tiers_->copies->device()));
  entry.copy = tiers_->copies->to_device(entry.device, entry.host);
}

at::Tensor ActivationOffload::unpack(Entry& entry) {
  bring_back(entry);
  // Prefetch: the block before this one in forward order runs backward next.
  if (entry.index > 0) bring_back(*entries_[entry.index - 1]);
  // The host waits for the copy (prefetched a block ago, so mostly done) before the buffer goes
  // back to the pool, where the next take() may overwrite it.
  entry.copy.wait();
  entry.host = at::Tensor();
  entry.taken = true;
  return std::exchange(entry.device, at::Tensor());
}

}  // namespace mmtrain
