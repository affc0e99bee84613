#include "parallel/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RecomputeFnHolder : torch::CustomClassHolder {
  BlockFn recompute_fn;
  std::vector<c10::intrusive_ptr<PackedInput>> packed;  // per input: set where the packer holds it
};

// An activation among a block's inputs: what a packer holds.
bool is_activation(const at::Tensor& t) { return t.defined() && t.is_floating_point() && t.requires_grad(); }

// Forward runs forward_fn under no-grad (a custom Function's forward saves nothing but what it
// asks for: the inputs, or for packed ones nothing but the packer's handle). Backward runs
// recompute_fn with grad on detached inputs and backpropagates through that graph, so parameter
// grads happen inside this backward.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs,
                            c10::intrusive_ptr<RecomputeFnHolder> holder, SavedInputPacker* packer,
                            const BlockFn& forward_fn) {
    std::vector<at::Tensor> kept = inputs.vec();
    if (packer) {
      holder->packed.resize(kept.size());
      for (size_t i = 0; i < kept.size(); ++i)
        if (is_activation(kept[i])) {
          holder->packed[i] = packer->pack(kept[i]);
          kept[i] = at::Tensor();
        }
    }
    ctx->save_for_backward(kept);
    ctx->saved_data["recompute_fn"] = c10::IValue::make_capsule(holder);
    // The block runs on the caller's tensors: packing only changed what is kept for backward.
    return forward_fn(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<RecomputeFnHolder>(
        ctx->saved_data["recompute_fn"].toCapsule());
    std::vector<at::Tensor> detached;
    detached.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      if (i < holder->packed.size() && holder->packed[i]) {  // an activation: it required grad
        detached.push_back(holder->packed[i]->unpack().detach().requires_grad_(true));
        holder->packed[i].reset();
        continue;
      }
      const auto& t = saved[i];
      detached.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
    }
    at::Tensor output;
    {
      at::AutoGradMode enable_grad(true);
      output = holder->recompute_fn(detached);
    }
    if (output.requires_grad()) torch::autograd::backward({output}, {grad_outputs[0]});
    variable_list grads;
    for (const auto& t : detached)
      grads.push_back(t.defined() && t.requires_grad() ? t.grad() : at::Tensor());
    grads.push_back(at::Tensor());  // holder
    grads.push_back(at::Tensor());  // packer
    grads.push_back(at::Tensor());  // forward_fn
    return grads;
  }
};

bool has_trained_params(Module& block) {
  for (auto& [name, p] : block.named_parameters())
    if (p->trainable && p->requires_grad) return true;
  return false;
}

struct RecomputeHook : BlockHook {
  std::shared_ptr<SavedInputPacker> packer;  // null: the inputs are saved as they are
  bool trains;  // the block has params that take grads

  RecomputeHook(std::shared_ptr<SavedInputPacker> p, bool block_trains) : packer(std::move(p)), trains(block_trains) {}

  at::Tensor run(const std::vector<at::Tensor>& inputs, BlockPass pass, const BlockNext& next) override {
    // Under no-grad (a frozen tower, evaluation) there is nothing to save, so nothing to recompute.
    if (!at::GradMode::is_enabled() || pass == BlockPass::recompute) return next(inputs, pass);
    // A Function's output needs grad only when an input does: a block that trains (LoRA adapters)
    // behind inputs that need none (a frozen embedding's output) gets a scalar leaf as an extra
    // input, or its backward, and its params' grads, would never run (peft's
    // enable_input_require_grads for the same reentrant checkpoint). The block never sees it.
    std::vector<at::Tensor> with_leaf = inputs;
    const size_t n = inputs.size();
    bool any = false;
    for (const auto& x : inputs) any = any || (x.defined() && x.requires_grad());
    if (trains && !any) with_leaf.push_back(at::zeros({}).requires_grad_(true));
    auto first_n = [n](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>(in.begin(), in.begin() + n); };
    auto holder = c10::make_intrusive<RecomputeFnHolder>();
    holder->recompute_fn = [next, first_n](const std::vector<at::Tensor>& in) {
      return next(first_n(in), BlockPass::recompute);
    };
    BlockFn forward_fn = [next, first_n](const std::vector<at::Tensor>& in) { return next(first_n(in), BlockPass::forward); };
    return CheckpointFunction::apply(at::TensorList(with_leaf), holder, packer.get(), forward_fn);
  }
};

}  // namespace

void apply_recompute(Module& model, const std::vector<std::string>& patterns, std::shared_ptr<SavedInputPacker> packer,
                     const std::set<const Module*>& packed) {
  for (auto& [name, block] : select_blocks(model, patterns, "recompute_plan.apply_modules"))
    block->add_hook(std::make_shared<RecomputeHook>(packed.count(block) ? packer : nullptr, has_trained_params(*block)));
}

}  // namespace mmtrain
