// Module and Param: the model tree that the parallelize chain (recompute, FSDP, ...) is applied
// to, and the one table of a model's tensors: every tensor's name, shape and checkpoint dtype is
// declared here, where the model creates it, and nowhere else.
//
// A Param is a named slot, not a tensor owner: `value` is whatever forward should read. FSDP
// keeps the fp32 shards itself and points `value` at the unsharded tensor while the owning
// unit is gathered (undefined otherwise), so model code never knows whether it is sharded.
// Modules that a parallelize step may wrap are "blocks": models call them through
// Module::apply, which runs the block's hook chain around the block's forward.
#pragma once
#include "quant/base_quant.h"

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct Param {
  std::string local_name;        // e.g. "weight"
  std::vector<int64_t> shape;    // full (unsharded) shape
  // The dtype the model's public (HF) checkpoint stores it in; what exports and weight
  // fixtures write. Training keeps fp32 masters whatever this says.
  at::ScalarType checkpoint_dtype = at::kFloat;
  // Gathered and computed in fp32 whatever parallel.fsdp_plan.param_dtype (layers the upstream
  // model keeps in fp32, e.g. MagiHuman's embedders and heads). Every param of one FSDP unit
  // must agree (fsdp/plan.h: unit_gather_dtype).
  bool compute_in_fp32 = false;
  at::Tensor value;              // what forward reads; undefined while sharded
  // How a fresh model fills it: normal(0, init_std) for matrices, a constant otherwise
  // (uniform(-init_bound, init_bound) for LoRA's A: Kaiming-uniform).
  enum class Init { normal, uniform, constant };
  Init init = Init::normal;
  double init_std = 0.02;
  double init_bound = 0.0;
  double init_constant = 0.0;
  // A buffer (e.g. fixed RoPE bands): loaded and saved like a parameter but never sharded or
  // trained; `value` always holds the full tensor. init_value computes it for a fresh model.
  bool trainable = true;
  std::function<at::Tensor()> init_value;
  // Frozen (trainable but requires_grad = false): sharded, gathered and checkpointed like any
  // parameter, but kept in the dtype it is gathered in, with no gradient, no reduction and no
  // optimizer state (fsdp/fully_shard.h). Autograd computes no gradient for it.
  bool requires_grad = true;
  // A LoRA matrix (nn/lora.h): not in the model's public checkpoint (loading one initialises
  // it by its rule), gathered and computed in this dtype (features.lora.adapter_dtype) whatever
  // param_dtype and the rest of its FSDP unit say. Unset for every other parameter.
  std::optional<at::ScalarType> adapter_dtype;
  // A frozen weight stored quantized (features.lora.base_quant; quant/quantized_rows.h): its FSDP
  // shard holds this rank's rows of codes and scales, gathered as bytes and dequantized into the
  // dtype it computes in before its unit runs. none for every other parameter.
  quant::BaseQuant base_quant = quant::BaseQuant::none;
};

// Rows [begin, end) of param's fresh value by its init rule, from a generator keyed by
// (seed, name): every world size and every caller builds the same values. fp32.
at::Tensor param_init_rows(const Param& param, const std::string& name, uint64_t seed, int64_t begin, int64_t end);

class Module;
using BlockFn = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

// Which run of a block a hook is in: the forward pass, or the block run again inside backward
// by activation recompute (parallel/recompute.h), whose graph then backpropagates at once.
enum class BlockPass { forward, recompute };

// The rest of a block's hook chain, then the block itself.
using BlockNext = std::function<at::Tensor(const std::vector<at::Tensor>& inputs, BlockPass pass)>;

// One step of a block's hook chain, installed by a parallelize step (parallel/parallelize.h
// fixes their order). run() must call next exactly once per pass it wants the block to run in.
// Closures it keeps for backward must hold next by value: it outlives Module::apply.
struct BlockHook {
  virtual ~BlockHook() = default;
  virtual at::Tensor run(const std::vector<at::Tensor>& inputs, BlockPass pass, const BlockNext& next) = 0;
};

class Module {
 public:
  virtual ~Module() = default;

  // Runs fn(inputs) as this block's forward, through the hook chain: the first hook added is
  // the outermost. inputs are the tensors autograd must see (activations); fn may run again in
  // backward (recompute), so it must capture by value.
  at::Tensor apply(const std::vector<at::Tensor>& inputs, const BlockFn& fn);

  // Appends a hook inside the ones already installed.
  void add_hook(std::shared_ptr<BlockHook> hook);
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
  // Shared with the closures Module::apply hands to hooks (they may outlive the call).
  std::shared_ptr<std::vector<std::shared_ptr<BlockHook>>> hooks_;
  bool is_block_ = false;
};

// A module that only groups children and buffers under a name ("dit", "layers", "rope").
class ModuleGroup : public Module {
 public:
  using Module::add_child;
  using Module::add_param;
};

// The modules of model that patterns select (core/module_pattern.h syntax), in module order, as
// (full name, module). Fails naming `key` (e.g. "fsdp_plan.apply_modules") when a pattern matches
// no module, and naming the module when a match is not a block: plans wrap blocks only.
std::vector<std::pair<std::string, Module*>> select_blocks(Module& model, const std::vector<std::string>& patterns,
                                                          const std::string& key);

}  // namespace mmtrain
