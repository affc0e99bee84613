#include "parallel/recompute.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct RecomputeFnHolder : torch::CustomClassHolder {
  BlockFn recompute_fn;
};

// Forward runs forward_fn under no-grad (a custom Function's forward saves nothing but what it
// asks for: the inputs). Backward runs recompute_fn with grad on detached inputs and
// backpropagates through that graph, so parameter grads happen inside this backward.
struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  static at::Tensor forward(AutogradContext* ctx, at::TensorList inputs,
                            c10::intrusive_ptr<RecomputeFnHolder> holder, const BlockFn& forward_fn) {
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["recompute_fn"] = c10::IValue::make_capsule(holder);
    return forward_fn(inputs.vec());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto saved = ctx->get_saved_variables();
    auto holder = c10::static_intrusive_pointer_cast<RecomputeFnHolder>(
        ctx->saved_data["recompute_fn"].toCapsule());
    std::vector<at::Tensor> detached;
    detached.reserve(saved.size());
    for (const auto& t : saved)
      detached.push_back(t.defined() ? t.detach().requires_grad_(t.requires_grad()) : t);
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
    grads.push_back(at::Tensor());  // forward_fn
    return grads;
  }
};

struct RecomputeHook : BlockHook {
  at::Tensor run(const std::vector<at::Tensor>& inputs, BlockPass pass, const BlockNext& next) override {
    // Under no-grad (a frozen tower, evaluation) there is nothing to save, so nothing to recompute.
    if (!at::GradMode::is_enabled() || pass == BlockPass::recompute) return next(inputs, pass);
    auto holder = c10::make_intrusive<RecomputeFnHolder>();
    holder->recompute_fn = [next](const std::vector<at::Tensor>& in) { return next(in, BlockPass::recompute); };
    BlockFn forward_fn = [next](const std::vector<at::Tensor>& in) { return next(in, BlockPass::forward); };
    return CheckpointFunction::apply(at::TensorList(inputs), holder, forward_fn);
  }
};

}  // namespace

void apply_recompute(Module& model, const std::vector<std::string>& patterns) {
  auto hook = std::make_shared<RecomputeHook>();
  for (auto& [name, block] : select_blocks(model, patterns, "recompute_plan.apply_modules")) block->add_hook(hook);
}

}  // namespace mmtrain
