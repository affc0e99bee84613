#include "tools/debug.h"

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "train/build.h"

namespace mmtrain {

void debug_step(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& batch_path, const std::string& out_path) {
  auto config = config_load(config_path, overrides);
  auto model = build_model(config);
  Fsdp fsdp(*model, std::make_shared<Comm>(nullptr, 0, 1), fsdp_options(config));
  load_initial_weights(config, *model, fsdp);

  SafetensorsFile batch_file(batch_path);
  Batch batch;
  for (const auto& name : batch_file.names()) batch[name] = batch_file.read(name);

  fsdp.begin_forward();
  auto out = model->forward(batch);
  out.loss.backward();
  fsdp.finish_backward();

  std::vector<std::pair<std::string, at::Tensor>> tensors = {{"loss", out.loss.detach().to(at::kFloat)}};
  for (const auto& [name, t] : out.tensors) tensors.emplace_back(name, t.detach().to(at::kFloat).contiguous());
  for (auto* unit : fsdp.units())
    for (auto& p : unit->params) {
      auto grad = unit->grad_flat.narrow(0, p.offset, p.layout.shard_numel()).view(p.shard.sizes()).narrow(0, 0, p.layout.dim0);
      tensors.emplace_back("grad." + model->hf_key(p.name), model->to_hf_layout(p.name, grad).contiguous());
    }
  safetensors_write(out_path, tensors);
}

}  // namespace mmtrain
