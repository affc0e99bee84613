#include "parallel/activation_offload.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <ATen/record_function.h>

#include <mutex>
#include <optional>
#include <string>
#include <utility>

namespace mmtrain {

struct ActivationOffload::Entry {
  size_t block = 0;        // index into blocks_
  at::Tensor device;       // on the device: until sent, and again once brought back
  at::Tensor host;         // in the host pool: from send until taken
  CopyEvent copy;          // the last copy started for it
  bool sent = false;
  bool taken = false;      // backward has it
};

namespace {

// The offload whose selected block is running forward on this thread (saved-tensor mode).
thread_local ActivationOffload* t_offloading = nullptr;

// Autograd's saved-tensor version check, which LibTorch skips for every tensor that passes through
// saved-tensor hooks (PyTorch's save_on_cpu included): the tensor's version when it was saved,
// compared when backward asks for it. The counter is shared with the tensor (and its views) but
// does not keep its memory alive, so an offloaded tensor is still checked after it left the device.
class SavedVersion {
 public:
  explicit SavedVersion(const at::Tensor& t)
      : counter_(t.unsafeGetTensorImpl()->version_counter()),
        saved_(counter_.enabled() ? counter_.current_version() : 0),
        description_(t.toString() + " " + c10::str(t.sizes())) {}

  // Raises autograd's own error when the tensor changed in place since it was saved.
  void check() const {
    if (!counter_.enabled() || counter_.current_version() == saved_) return;
    TORCH_CHECK(false, "one of the variables needed for gradient computation has been modified by an inplace "
                "operation: [", description_, "] is at version ", counter_.current_version(), "; expected version ",
                saved_, " instead. (Activation offload held it for backward; mmtrain checks what stock saved-tensor "
                "hooks do not.) Hint: the in-place change must go, or clone the tensor before changing it.");
  }

 private:
  c10::VariableVersion counter_;
  uint32_t saved_;
  std::string description_;
};

// Recompute's handle of an offloaded block input.
struct OffloadedInput : PackedInput {
  std::shared_ptr<ActivationOffload> offload;
  std::shared_ptr<ActivationOffload::Entry> entry;
  SavedVersion version;

  OffloadedInput(std::shared_ptr<ActivationOffload> o, std::shared_ptr<ActivationOffload::Entry> e, const at::Tensor& t)
      : offload(std::move(o)), entry(std::move(e)), version(t) {}
  at::Tensor unpack() override {
    version.check();
    return offload->unpack(*entry);
  }
};

// One saved tensor's hooks: kept in place, or an offloaded entry; released with the node.
struct OffloadHooks : torch::autograd::SavedVariableHooks {
  std::shared_ptr<ActivationOffload> offload;
  std::shared_ptr<ActivationOffload::Entry> entry;
  at::Tensor kept;
  std::optional<SavedVersion> version;

  explicit OffloadHooks(std::shared_ptr<ActivationOffload> o) : offload(std::move(o)) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    version.emplace(tensor);
    if (offload->keep_in_place(tensor))
      kept = tensor;
    else
      entry = offload->add(tensor);
  }
  at::Tensor call_unpack_hook() override {
    version->check();
    return kept.defined() ? kept : offload->unpack(*entry);
  }
};

// The process's autograd Engine with default saved-tensor hooks: those of the offload running on
// this thread, none elsewhere (then it is LibTorch's Engine unchanged).
struct HookingEngine : torch::autograd::Engine {
  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks() override {
    if (!t_offloading) return nullptr;
    return std::make_unique<OffloadHooks>(t_offloading->shared_from_this());
  }
};

torch::autograd::Engine& hooking_engine() {
  static auto* engine = new HookingEngine();  // never destroyed: its worker threads live to exit
  return *engine;
}

struct SavedTensorHook : BlockHook {
  std::shared_ptr<ActivationOffload> offload;

  explicit SavedTensorHook(std::shared_ptr<ActivationOffload> o) : offload(std::move(o)) {}
  at::Tensor run(const std::vector<at::Tensor>& inputs, BlockPass pass, const BlockNext& next) override {
    if (!at::GradMode::is_enabled() || pass == BlockPass::recompute) return next(inputs, pass);
    offload->begin_block();
    struct Scope {
      ActivationOffload* outer;
      explicit Scope(ActivationOffload* o) : outer(std::exchange(t_offloading, o)) {}
      ~Scope() { t_offloading = outer; }
    } scope(offload.get());
    return next(inputs, pass);
  }
};

}  // namespace

ActivationOffload::ActivationOffload(std::shared_ptr<OffloadTiers> tiers) : tiers_(std::move(tiers)) {}

c10::intrusive_ptr<PackedInput> ActivationOffload::pack(const at::Tensor& input) {
  begin_block();
  return c10::make_intrusive<OffloadedInput>(shared_from_this(), add(input), input);
}

std::shared_ptr<BlockHook> ActivationOffload::saved_tensor_hook() {
  static std::once_flag installed;
  std::call_once(installed, [] { torch::autograd::set_default_engine_stub(&hooking_engine); });
  return std::make_shared<SavedTensorHook>(shared_from_this());
}

bool ActivationOffload::keep_in_place(const at::Tensor& t) const {
  return !t.is_floating_point() || t.is_leaf() || (keep_in_place_ && keep_in_place_(t));
}

void ActivationOffload::begin_block() {
  // A forward after the last one's backward (every entry taken, or released with its graph)
  // starts a new list.
  bool over = true;
  for (const auto& block : blocks_)
    for (const auto& weak : block)
      if (auto entry = weak.lock()) over = over && entry->taken;
  if (over) blocks_.clear();
  // This block starts: what the previous one kept leaves the device.
  if (!blocks_.empty())
    for (const auto& weak : blocks_.back())
      if (auto entry = weak.lock(); entry && !entry->sent && !entry->taken) send(*entry);
  blocks_.emplace_back();
  in_block_.clear();
}

std::shared_ptr<ActivationOffload::Entry> ActivationOffload::add(const at::Tensor& t) {
  if (blocks_.empty()) blocks_.emplace_back();
  // A tensor saved by several ops of the block (a norm's input is also the residual) travels once.
  auto& known = in_block_[t.unsafeGetTensorImpl()];
  if (auto entry = known.lock()) return entry;
  auto entry = std::make_shared<Entry>();
  known = entry;
  entry->block = blocks_.size() - 1;
  entry->device = t;
  blocks_.back().push_back(entry);
  return entry;
}

void ActivationOffload::send(Entry& entry) {
  RECORD_USER_SCOPE("offload::activation_to_host");
  const at::Tensor& t = entry.device;
  // Dense tensors keep their strides (a backward formula may read them); others come back contiguous.
  if (t.is_non_overlapping_and_dense())
    entry.host = tiers_->host_pool->take({t.numel()}, t.scalar_type()).as_strided(t.sizes(), t.strides());
  else
    entry.host = tiers_->host_pool->take(t.sizes(), t.scalar_type());
  entry.copy = tiers_->copies->to_host(entry.host, t);
  // The copy stream holds the device memory until the copy is done (CopyStream marks it used),
  // so the training side can let go of it now.
  entry.device = at::Tensor();
  entry.sent = true;
}

void ActivationOffload::bring_back(Entry& entry) {
  if (entry.device.defined() || !entry.host.defined()) return;  // on the device already
  RECORD_USER_SCOPE("offload::activation_to_device");
  entry.copy.wait();  // its trip to the host finished
  entry.device = at::empty_strided(entry.host.sizes(), entry.host.strides(),
                                   entry.host.options().device(tiers_->copies->device()));
  entry.copy = tiers_->copies->to_device(entry.device, entry.host);
}

void ActivationOffload::bring_back_block(size_t block) {
  if (block >= blocks_.size()) return;
  for (const auto& weak : blocks_[block])
    if (auto entry = weak.lock(); entry && !entry->taken) bring_back(*entry);
}

at::Tensor ActivationOffload::unpack(Entry& entry) {
  if (entry.taken) return entry.device;  // another op of the block saved the same tensor
  // The block's backward needs all it kept; the block before it runs backward next (prefetch).
  bring_back_block(entry.block);
  if (entry.block > 0) bring_back_block(entry.block - 1);
  // The host waits for the copy (started a block ago, so mostly done) before the buffer goes
  // back to the pool, where the next take() may overwrite it.
  entry.copy.wait();
  entry.host = at::Tensor();
  entry.taken = true;
  // The entry keeps the tensor while a holder (a saved-tensor hook, recompute's packed input)
  // lives, as a saved tensor is kept until its node is done.
  return entry.device;
}

}  // namespace mmtrain
