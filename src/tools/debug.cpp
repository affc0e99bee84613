// `mmtrain debug collate`: the trainer's data path (registries, GlobalBatchSampler, collate_generator) for
// one micro-batch, written to safetensors with where it came from in the metadata.
#include "tools/debug.h"

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/error.h"
#include "data/dataset.h"

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
  auto dataset = dataset_registry().get(c.data.dataset_type, "config " + c.source_path + ": data.dataset_param.dataset_type")(c.data);
  auto collator = collator_registry().get(c.data.collate_model_name,
                                          "config " + c.source_path + ": data.dataloader_param.collate_param.model_name")(c.data);
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
  auto generator = collate_generator(c.training.seed, o.step, o.micro, o.rank);
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

}  // namespace mmtrain
