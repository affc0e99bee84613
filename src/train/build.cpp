#include "train/build.h"

#include "train/weights.h"

namespace mmtrain {

std::shared_ptr<Model> build_model(const Config& config) {
  return model_registry().get(config.model.model_id, "config " + config.source_path + ": model.model_id")(
      config.model.config);
}

FsdpOptions fsdp_options(const Config& config) {
  const auto& plan = config.parallel.fsdp_plan;
  FsdpOptions options;
  options.apply_modules = plan.apply_modules;
  options.param_dtype = plan.param_dtype;
  options.reduce_dtype = plan.reduce_dtype;
  options.reshard_after_forward = plan.reshard_after_forward;
  options.num_to_forward_prefetch = plan.num_to_forward_prefetch;
  options.num_to_backward_prefetch = plan.num_to_backward_prefetch;
  if (config.features.recompute) options.recompute_modules = config.features.recompute_plan.apply_modules;
  return options;
}

std::unique_ptr<AdamW> make_fsdp_adamw(Fsdp& fsdp, const AdamWOptions& options) {
  std::vector<at::Tensor> params, grads;
  const auto units = fsdp.units();
  for (auto* unit : units) {
    params.push_back(unit->shard_flat);
    grads.push_back(unit->grad_flat);
  }
  auto adamw = std::make_unique<AdamW>(params, grads, options);
  for (size_t u = 0; u < units.size(); ++u) adamw->set_update_mask(u, fsdp_trainable_mask(*units[u]));
  return adamw;
}

int64_t load_initial_weights(const Config& config, Model& model, Fsdp& fsdp) {
  const auto& m = config.model;
  const std::string path = !m.checkpoint_path.empty() ? m.checkpoint_path : m.model_name_or_path;
  if (path.empty()) {
    fsdp.init_params(config.training.seed);
    init_buffers(model, fsdp.options().device);
    return 0;
  }
  return load_hf_weights(model, fsdp, WeightSource(path));
}

}  // namespace mmtrain
