// Turning a Config into the pieces of a run: the model (its spec's Module tree, shapes only),
// the parallelize chain over it, the optimizer, the initial weights and the data pipeline. The
// trainer, `debug step`, `debug collate`, `convert` and the multi-rank tests build through these,
// so they cannot drift from each other.
#pragma once
#include "data/data_loader.h"
#include "dist/device_mesh.h"
#include "dist/runtime.h"
#include "fsdp/fully_shard.h"
#include "models/model_spec.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "config/config.h"
#include "config/registries.h"
#include "train/lora_base.h"

#include <memory>

namespace mmtrain {

std::shared_ptr<Model> build_model(const Config& config);
// The device mesh of the run, of the shape dims gives (config_check_world's result for the
// runtime's world). Collective over the runtime's world (every rank builds its groups).
DeviceMesh build_mesh(const ParallelDims& dims, const Runtime& runtime);
// The parallelize chain the config asks for (context parallelism, features.recompute_plan,
// activation offload, parallel.fsdp_plan) over the mesh; its offload features use tiers (null:
// fresh ones for the mesh's device).
std::unique_ptr<Fsdp> parallelize_model(const Config& config, Model& model, const DeviceMesh& mesh,
                                        std::shared_ptr<OffloadTiers> tiers = nullptr);
AdamWOptions adamw_options(const TrainingConfig& training);
// AdamW over every unit's fp32 flat shard and grad (the trained params: frozen ones are not in
// them). With fsdp_plan.cpu_offload the moments are in the host tier, beside the shards.
std::unique_ptr<AdamW> make_fsdp_adamw(Fsdp& fsdp, const AdamWOptions& options,
                                       const std::shared_ptr<OffloadTiers>& tiers = nullptr);
// Where each unit's trained params sit in its flat shard and how the shard group cuts them: the
// 8-bit AdamW's layout (one list per unit, its trained params in order).
std::vector<std::vector<ShardedParamSpan>> fsdp_param_spans(Fsdp& fsdp);
// training.optimizer's optimizer over the units: AdamW (adamw, adamw_swap: its moments are swapped
// by the caller), or the 8-bit AdamW (adamw8bit) with each trained param's rows located in its
// unit's shard and the straddling blocks' absmax agreed over the shard group.
std::unique_ptr<Optimizer> make_fsdp_optimizer(Fsdp& fsdp, const TrainingConfig& training,
                                               const std::shared_ptr<OffloadTiers>& tiers = nullptr);
// Weights from model.checkpoint_path / model_name_or_path (HF layout, through the model's HF
// adapter), else a seeded random init. Returns how many tensors had their layout converted (0 for
// a random init).
int64_t load_initial_weights(const Config& config, Model& model, Fsdp& fsdp);

// The data of a run, as one data-parallel rank sees it: the dataset and collator of the config's
// registries and the sampler (data.dataloader_param's shuffle, drop_last and token budget,
// training.seed).
// With data.validation_split, the dataset is the training part (data/held_out.h).
DataPipeline build_data(const Config& config, int dp_rank, int dp_world);

// What data.validation_split's held-out set is drawn from, which a checkpoint records
// ("held_out": {"validation_split", "seed", "samples"}: the fraction, training.seed and the size
// of the whole data set) so that a resume that would draw another set is refused; null without
// a split. training: build_data's data set.
nlohmann::json held_out_draw(const Config& config, const Dataset& training);
// "" when a resume's draw (now) holds out the same samples as the checkpoint's (saved); else why not.
std::string held_out_draw_difference(const nlohmann::json& saved, const nlohmann::json& now);

// The held-out set evaluation reads: data.validation's data set, or the samples
// data.validation_split holds out of the training set (training: build_data's data set, a
// SubsetDataset whose base is reused, not read again); null when the config names neither.
std::shared_ptr<Dataset> build_validation_dataset(const Config& config, const std::shared_ptr<Dataset>& training);

}  // namespace mmtrain
