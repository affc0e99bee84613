// Config: the typed form of a MindSpeed-MM-style FSDP2 YAML (sections parallel, model, data,
// features, training, logging). config_load reads a file, applies "a.b.c=value" overrides and
// validates; any unknown key, wrong type or impossible combination is an Error naming the key
// path and the file. Checks that need the world size are separate (config_check_world), since
// the config is read before the process group exists. Reference: docs/config.md.
#pragma once
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct FsdpPlanConfig {
  std::vector<std::string> apply_modules;      // module patterns, e.g. "dit.block.layers.{*}"; order matters
  std::vector<std::string> ignored_modules;    // module patterns whose parameters stay unsharded
  at::ScalarType param_dtype = at::kFloat;     // yaml: fp32|float32|bf16|bfloat16|fp16|float16
  at::ScalarType reduce_dtype = at::kFloat;    // dtype of gradient reduce-scatter
  bool reshard_after_forward = true;           // free unsharded params after forward (re-gather in backward)
  int num_to_forward_prefetch = 1;             // blocks all-gathered ahead in forward
  int num_to_backward_prefetch = 1;            // blocks all-gathered ahead in backward
  bool cpu_offload = false;                    // sharded params, grads and optimizer step on the host
};

struct ParallelConfig {
  int data_parallel_size = 0;                  // 0 = "auto": world / (tp * ulysses * ring); else must equal it
  int fully_shard_parallel_size = 0;           // 0 = "auto": world / tensor_parallel_size (FSDP shards over dp x cp)
  int tensor_parallel_size = 1;
  int ring_attention_size = 1;
  int ulysses_parallel_size = 1;
  int expert_parallel_size = 1;
  int expert_fully_shard_parallel_size = 1;    // 0 = "auto": world / expert_parallel_size
  FsdpPlanConfig fsdp_plan;
};

struct ModelConfig {
  std::string model_id;                        // registry name, e.g. "magihuman", "test_transformer"
  std::string model_name_or_path;              // HF weights directory or safetensors file; empty = random init
  std::string checkpoint_path;                 // preferred over model_name_or_path when set
  bool enable_gradient_checkpointing = false;  // the model's own checkpointing (features.recompute is separate)
  nlohmann::json config = nlohmann::json::object();  // model-specific dimensions (`model.config:` map), checked by the model
};

struct DataConfig {
  std::string dataset_type;                    // data.dataset_param.dataset_type
  nlohmann::json dataset_param = nlohmann::json::object();     // the whole dataset_param map (model-specific keys checked by the dataset)
  std::string collate_model_name;              // data.dataloader_param.collate_param.model_name
  nlohmann::json dataloader_param = nlohmann::json::object();  // the whole dataloader_param map
};

struct RecomputePlanConfig {
  std::vector<std::string> apply_modules;      // module patterns whose activations are recomputed in backward
  bool use_reentrant = true;                   // (MindSpeed's default is false)
};

struct FeaturesConfig {
  std::string loss_type = "raw";               // features.loss_cfg.loss_type: default|raw|per-sample|per-token
  bool recompute = false;                      // activation recomputation on recompute_plan.apply_modules
  RecomputePlanConfig recompute_plan;
  bool enable_activation_offload = false;      // saved activations of the selected blocks go to the host
  std::vector<std::string> activation_offload_modules;   // activation_offload_plan.apply_modules
};

struct TrainingConfig {
  int micro_batch_size = 1;                    // samples per rank per forward
  int gradient_accumulation_steps = 1;         // micro-batches per optimizer step
  int global_batch_size = 0;                   // 0 = micro * accum * data-parallel size; else must equal it
  uint64_t seed = 42;
  double lr = 1e-5;                            // peak learning rate
  double lr_min = 0.0;                         // floor of the decay
  double lr_warmup_ratio = 0.0;                // fraction of train_iters with linear warm-up
  std::string lr_decay_style = "constant";     // constant|linear|cosine
  double weight_decay = 0.0;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double clip_grad = 0.0;                      // max global grad norm; 0 = no clipping
  int64_t train_iters = 0;                     // optimizer steps
  std::string optimizer = "adamw";             // adamw (adamw_swap later)
  bool adam_fused = false;                     // fused multi-tensor AdamW kernel
  bool init_model_with_meta_device = false;    // build on meta, materialise only local shards
  std::string load;                            // checkpoint dir or save root to resume from; empty = none
  bool no_load_optim = false;                  // resume weights but not optimizer state
  bool no_load_rng = false;                    // resume without restoring RNG state
  std::string save;                            // save root; empty = never save
  int64_t save_interval = 0;                   // 0 = only at the end (when save is set)
  int64_t log_interval = 1;
  int64_t exit_interval = 0;                   // stop (after saving) once iteration % this == 0; 0 = never                    // iterations between metric lines
  bool use_deter_comp = false;                 // deterministic kernels
  std::vector<std::string> plugin;             // accepted for seed compatibility; mmtrain registers statically
};

struct LoggingConfig {
  std::string output_dir = "runs/default";     // metrics.jsonl and logs go here
  bool progress = true;                        // progress display when stdout is a terminal
  double hardware_flops = 0.0;                 // peak FLOP/s of one device, for MFU; 0 = not reported
};

struct Config {
  std::string source_path;                     // the YAML file it was read from (for messages)
  ParallelConfig parallel;
  ModelConfig model;
  DataConfig data;
  FeaturesConfig features;
  TrainingConfig training;
  LoggingConfig logging;
};

// Reads path, applies overrides ("a.b.c=value", value parsed as YAML scalar/flow, e.g.
// "training.lr=3e-4", "parallel.fsdp_plan.apply_modules=[layers.{*}]"), then validates.
Config config_load(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text; source_name stands for the file name in messages and source_path.
Config config_from_yaml_string(const std::string& text, const std::string& source_name,
                               const std::vector<std::string>& overrides = {});

// The effective config in the YAML layout (dtypes as fp32/bf16/fp16, auto sizes as "auto"), for
// logs and checkpoints. Feeding its dump() back to config_from_yaml_string gives the same
// Config. source_path is not included (it is not a YAML key).
nlohmann::json config_to_json(const Config& config);

// Checks what needs the world size (MindSpeed's ParallelArguments rules): world divisible by
// tp * ulysses * ring; fully_shard_parallel_size divides world / tp and is a multiple of
// ulysses * ring; data_parallel_size and global_batch_size, when set, equal what world implies;
// world divisible by expert_parallel_size * expert_fully_shard_parallel_size.
void config_check_world(const Config& config, int world_size);
// config_check_world, then refuses (naming the key) what the seed's config can express but
// mmtrain does not implement yet: tensor/context/expert parallelism, HSDP, ignored_modules,
// parameter and activation offload, loss types other than raw, model-internal checkpointing.
// `train` and `debug step` call it; `plan` does not (it can plan layouts mmtrain cannot run).
void config_check_supported(const Config& config, int world_size);
// Ranks in one FSDP shard group (the dp_shard x ulysses x ring mesh): auto -> world / tp.
// Checks the world first.
int config_fsdp_size(const Config& config, int world_size);
// Data-parallel size (ranks that see different samples): world / (tp * ulysses * ring).
int config_dp_size(const Config& config, int world_size);
// Samples per optimizer step over all ranks: micro * accum * data-parallel size.
int64_t config_global_batch_size(const Config& config, int world_size);

}  // namespace mmtrain
