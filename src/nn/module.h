// Module and Param: the model tree that FSDP and recompute plans are applied to.
//
// A Param is a named slot, not a tensor owner: `value` is whatever forward should read. FSDP
// keeps the fp32 shards itself and points `value` at the unsharded tensor while the owning
// unit is gathered (undefined otherwise), so model code never knows whether it is sharded.
// Modules that FSDP units or recompute may wrap are "blocks": models call them through
// Module::apply, which is where the unshard / reshard / checkpoint hooks run.
#pragma once
#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct Param {
  std::string local_name;        // e.g. "weight"
  std::vector<int64_t> shape;    // full (unsharded) shape
  at::Tensor value;              // what forward reads; undefined while sharded
  // How a fresh model fills it: normal(0, init_std) for matrices, a constant otherwise.
  double init_std = 0.02;
  double init_constant = 0.0;
  bool init_normal = true;
  // A buffer (e.g. fixed RoPE bands): loaded and saved like a parameter but never sharded or
  // trained; `value` always holds the full tensor. init_value computes it for a fresh model.
  bool trainable = true;
  std::function<at::Tensor()> init_value;
  // Frozen (trainable but requires_grad = false): sharded, gathered and checkpointed like any
  // parameter, but FSDP reduces no gradient for it (its grad shard stays zero) and the
  // optimizer leaves it unchanged (fsdp_trainable_mask). The model should not build a graph
  // through it (e.g. run a frozen tower under at::NoGradGuard).
  bool requires_grad = true;
};

class Module;
using BlockFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// Installed on a block by FSDP and the recompute plan; apply() delegates to it.
struct BlockHooks {
  virtual ~BlockHooks() = default;
  virtual at::Tensor run(Module& block, const std::vector<at::Tensor>& inputs, const BlockFn& fn) = 0;
};

class Module {
 public:
  virtual ~Module() = default;

  // Runs fn(inputs) as this block's forward, through the installed hooks if any. inputs are
  // the tensors autograd must see (activations); everything else fn captures by reference.
  at::Tensor apply(const std::vector<at::Tensor>& inputs, const BlockFn& fn);

  void set_hooks(std::shared_ptr<BlockHooks> hooks) { hooks_ = std::move(hooks); }
  bool is_block() const { return is_block_; }

  // Full dotted names, pre-order, this module first as "" (or prefix).
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  std::vector<std::pair<std::string, Param*>> named_parameters(const std::string& prefix = "");
  // Parameters of this module only, not of its children.
  std::vector<std::pair<std::string, Param*>> own_parameters();

 protected:
  Param& add_param(const std::string& name, std::vector<int64_t> shape);
  template <typename M>
  std::shared_ptr<M> add_child(const std::string& name, std::shared_ptr<M> child) {
    children_.emplace_back(name, child);
    return child;
  }
  // Marks this module as callable through apply(), so plans may wrap it.
  void mark_block() { is_block_ = true; }

 private:
  std::vector<std::unique_ptr<Param>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<BlockHooks> hooks_;
  bool is_block_ = false;
};

// A module that only groups children and buffers under a name ("dit", "layers", "rope").
class ModuleGroup : public Module {
 public:
  using Module::add_child;
  using Module::add_param;
};

// y = x @ w^T for w [out, in] (the nn.Linear convention used by every checkpoint we load).
inline at::Tensor linear(const at::Tensor& x, const Param& w) { return at::linear(x, w.value); }

}  // namespace mmtrain
