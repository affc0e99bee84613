// `mmtrain debug collate`: the trainer's data path (registries, GlobalBatchSampler, collate_generator) for
// one micro-batch, written to safetensors with where it came from in the metadata.
// `mmtrain debug step`: the trainer's model path (build_model, FSDP on one rank, weights) for one
// forward + backward.
#include "tools/debug.h"

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/error.h"
#include "data/dataset.h"
#include "train/build.h"

#include <filesystem>

namespace mmtrain {

void debug_collate(const std::string& config_path, const std::vector<std::string>& overrides,
                   const std::string& out_path, const DebugCollateOptions& o) {
  const auto c = config_load(config_path, overrides);
  if (o.world < 1 || o.rank < 0 || o.rank >= o.world)
    fail("debug collate: expected 0 <= --rank < --world, found rank ", o.rank, ", world ", o.world);
  config_check_world(c, o.world);
  if (o.step < 0) fail("debug collate: --step must be >= 0, found ", o.step);
  if (o.micro < 0 || o.micro >= c.training.gradient_accumulation_steps)
    fail("debug collate: --micro must be in 0..", c.training.gradient_accumulation_steps - 1,
         " (training.gradient_accumulation_steps), found ", o.micro);
  // The trainer's construction (src/train/trainer.cpp): registries, sampler, generator.
  auto dataset = dataset_registry().get(c.data.dataset_type, "config " + c.source_path + ": data.dataset_param.dataset_type")(c);
  auto collator = collator_registry().get(c.data.collate_model_name,
                                          "config " + c.source_path + ": data.dataloader_param.collate_param.model_name")(c);
  GlobalBatchSampler sampler;
  sampler.num_samples = dataset->size();
  sampler.micro_batch_size = c.training.micro_batch_size;
  sampler.gradient_accumulation_steps = c.training.gradient_accumulation_steps;
  sampler.dp_world = o.world;
  sampler.dp_rank = o.rank;
  std::vector<Batch> samples;
  std::string indices;
  for (int64_t index : sampler.indices(o.step, o.micro)) {
    samples.push_back(dataset->get(index));
    indices += (indices.empty() ? "" : ",") + std::to_string(index);
  }
  auto generator = collate_generator(c.training.seed, sampler.first_position(o.step, o.micro));
  const auto batch = collator->collate(samples, generator);

  std::vector<std::pair<std::string, at::Tensor>> tensors(batch.begin(), batch.end());  // std::map: sorted
  const auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  safetensors_write(out_path, tensors,
                    {{"step", std::to_string(o.step)},
                     {"micro", std::to_string(o.micro)},
                     {"rank", std::to_string(o.rank)},
                     {"world", std::to_string(o.world)},
                     {"seed", std::to_string(c.training.seed)},
                     {"sample_indices", indices}});
}

void debug_step(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& batch_path, const std::string& out_path) {
  auto config = config_load(config_path, overrides);
  config_check_supported(config, 1);  // one process, like the trainer at world size 1
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
      if (!p.param->requires_grad) continue;  // frozen: no grad by construction
      auto grad = p.view_of(unit->grad_flat).narrow(0, 0, p.layout.dim0);
      tensors.emplace_back("grad." + model->hf_key(p.name), model->to_hf_layout(p.name, grad).contiguous());
    }
  safetensors_write(out_path, tensors);
}

}  // namespace mmtrain
