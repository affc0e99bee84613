// Config: one training run, the typed form of a MindSpeed-MM-style FSDP2 YAML. Its seven sections
// are each declared by the component that reads them (parallel: parallel/parallel_config.h with
// fsdp/fsdp_config.h, model: models/model_config.h, data: data/data_config.h, features:
// parallel/features_config.h, training: config/training_config.h, logging: record/metrics.h,
// tools: record/tools_config.h);
// this file mounts them and reads files through the generic reader (core/config_schema.h). Any
// unknown key, wrong type or impossible value is an Error naming the key path and the file.
// Checks that need the world size are separate (config_check_world): the config is read before
// the process group exists. Reference: docs/config.md.
#pragma once
#include "data/data_config.h"
#include "models/model_config.h"
#include "parallel/features_config.h"
#include "parallel/parallel_config.h"
#include "parallel/parallel_dims.h"
#include "record/logging_config.h"
#include "record/tools_config.h"
#include "config/training_config.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct Config {
  std::string source_path;                     // the YAML file it was read from (for messages)
  ParallelConfig parallel;
  ModelConfig model;
  DataConfig data;
  FeaturesConfig features;
  TrainingConfig training;
  LoggingConfig logging;
  ToolsConfig tools;
};

// Reads path, applies overrides ("a.b.c=value", value parsed as a YAML scalar or flow list/map,
// e.g. "training.lr=3e-4", "parallel.fsdp_plan.apply_modules=[layers.{*}]"), then validates.
Config config_load(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text; source_name stands for the file name in messages and source_path.
Config config_from_yaml_string(const std::string& text, const std::string& source_name,
                               const std::vector<std::string>& overrides = {});

// The effective config in the YAML layout (dtypes as fp32/bf16/fp16, auto sizes as "auto"), for
// logs and checkpoints. Feeding its dump() back to config_from_yaml_string gives the same
// Config. source_path is not included (it is not a YAML key).
nlohmann::json config_to_json(const Config& config);

// Checks what needs the world size: the parallel degrees (parallel_dims, which it returns) and
// the global batch (config_accumulation).
ParallelDims config_check_world(const Config& config, int world_size);
// The one owner of the global batch: micro-batches per optimizer step on this world.
//   training.global_batch_size 0: gradient_accumulation_steps (0 means 1); the global batch is
//     then micro x accumulation x data-parallel size.
//   training.global_batch_size G: G / (micro x data-parallel size), which must be whole; a set
//     gradient_accumulation_steps must equal it. So G stays the same when the world changes.
// Errors name both keys and the numbers.
int config_accumulation(const Config& config, const ParallelDims& dims);
// Samples per optimizer step on this world: micro x config_accumulation x data-parallel size.
int64_t config_global_batch(const Config& config, const ParallelDims& dims);
// config_check_world, writing the resolved accumulation into config.training, which every reader
// after it (the sampler, the train step, the checkpoint's config) then sees. Returns the degrees.
ParallelDims config_resolve_world(Config& config, int world_size);
// config_check_world, then refuses, naming the key, every seed key mmtrain accepts in a YAML but
// does not implement (the list in config.cpp: each must be left at its default), and checks
// training.plugin against the built-in models and datasets. `train` and `debug step` call it;
// `plan` does not (it can plan layouts mmtrain cannot run). Returns the degrees.
ParallelDims config_check_supported(const Config& config, int world_size);
// A token budget (data.dataloader_param.micro_batch_tokens) sizes the micro-batches itself:
// training.micro_batch_size must stay 1 (an error naming both keys otherwise).
void config_check_token_budget(const Config& config);
// A preference objective (training.objective dpo) without LoRA keeps a frozen copy of the initial
// weights as its reference (train/preference_reference.h); under LoRA the reference is the model
// with its adapters off.
bool config_needs_reference_copy(const Config& config);

}  // namespace mmtrain
