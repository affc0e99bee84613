// Training state on disk: the one module that saves and loads everything an mmtrain checkpoint
// holds (the format itself is checkpoint/sharded_checkpoint.h and docs/checkpoint_format.md):
//   model.<name>             a parameter: this rank's FSDP rows (fp32); a buffer: whole, on rank 0
//   optim.exp_avg.<name>     AdamW moments, the same rows as the parameter
//   optim.exp_avg_sq.<name>
//   optim.exp_avg_codes.<name>, ...: the 8-bit AdamW's state instead (train/state_adamw8bit.h)
//   trainer_state.json       iteration, consumed_samples, global_batch_size, optimizer_step,
//                            model_id, the run's config, and per rank its CPU RNG state and
//                            node (dist/node_names.h)
// A model-only checkpoint (`convert hf-to-ckpt`) has no optim.* tensors and says model_only; a
// run that loads it starts at iteration 0 from its weights.
#pragma once
#include "checkpoint/async_checkpoint.h"
#include "checkpoint/best_checkpoints.h"
#include "checkpoint/sharded_checkpoint.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "optim/optimizer.h"
#include "optim/ema.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace mmtrain {

// The checkpoint name of a model parameter or buffer: "model." + name; of its AdamW moments.
std::string state_model_key(const std::string& param_name);
std::string state_exp_avg_key(const std::string& param_name);
// A trained param's EMA shadow (training.ema), in the checkpoints of a run that keeps one.
std::string state_ema_key(const std::string& param_name);
std::string state_exp_avg_sq_key(const std::string& param_name);

// The index's plan entry for shards laid out by an Fsdp built with plan: apply_modules, param and
// reduce dtypes (the YAML's spelling) and the sharding rule. The trainer and `convert` both use it.
nlohmann::json state_plan_entry(const FsdpConfig& plan);

// Restores this process's CPU generator from the rank_state that `rank` saved: its
// cpu_rng_state must be the lowercase hex of a state of exactly the generator's size; anything
// else is an error naming the rank file and the key.
void state_restore_rng(const CheckpointReader& reader, int rank);

struct StateInfo {
  int64_t iteration = 0;                // optimizer steps taken
  int64_t global_batch_size = 0;        // samples per step (0 for a model-only checkpoint)
  std::string model_id;
  nlohmann::json config;                // the run's config (config_to_json) or at least {model: {...}}
  nlohmann::json extra = nlohmann::json::object();  // more trainer_state.json fields ("source": ...)
  nlohmann::json plan = nlohmann::json::object();   // the index's plan entry (FSDP plan, provenance)
  // A LoRA run's checkpoint holds what trains (adapters, modules_to_save, their moments), not the
  // frozen base: lora_base names the base ({"weights", "fingerprint"} or {"init_seed"}), recorded
  // in trainer_state.json and required again on resume. Null: every param is saved.
  nlohmann::json lora_base;
  // A full fine-tuning preference run: its frozen reference (train/preference_reference.h), recorded
  // in trainer_state.json and required again on resume. Null otherwise.
  nlohmann::json preference_reference;
  // training.ema: the live EMA, whose shadows the checkpoint holds as "ema.<param>" beside the
  // weights (and its settings as trainer_state.json "ema"). Null: none.
  const Ema* ema = nullptr;
};

// trainer_state.json of a checkpoint of info.iteration (optimizer_step absent: model-only), and
// this process's rank_state (its CPU generator, its node): what state_save writes, for tools
// that write a checkpoint tensor by tensor (checkpoint_save with ShardedTensor::fetch).
nlohmann::json state_global_state(const StateInfo& info, std::optional<int64_t> optimizer_step);
nlohmann::json state_rank_state();

// Saves a checkpoint of iteration info.iteration under save_root (collective, crash-safe) and
// returns its directory. optimizer null: a model-only checkpoint. Non-finite weights or moments on
// any rank: nothing is written, and every rank throws (the one holding them names the tensor).
// before_commit: as for checkpoint_save.
std::string state_save(const std::string& save_root, Comm& comm, Model& model, Fsdp& fsdp, const Optimizer* optimizer,
                       const StateInfo& info, const std::function<void()>& before_commit = {});

// state_save through the asynchronous saver (training.async_save): collective; returns once this
// rank's state is staged. The background writer refuses non-finite state (it checks the staged
// copy, off the training thread), which fails the save at a later poll() on every rank.
AsyncCheckpointSaver::Staged state_save_async(AsyncCheckpointSaver& saver, const std::string& save_root, Comm& comm,
                                              Model& model, Fsdp& fsdp, const Optimizer& optimizer, const StateInfo& info,
                                              int keep_latest_k);

struct StateLoadOptions {
  std::string model_id;                 // must equal the checkpoint's
  int64_t global_batch_size = 0;        // must equal the checkpoint's (the data position is step x G)
  bool load_optimizer = true;           // false: weights only (training.no_load_optim)
  bool load_rng = true;                 // false: fresh RNG (training.no_load_rng); also skipped on a new world size
  // The model the config builds: a training checkpoint must have saved the same model.config
  // (apart from these keys, which do not change the model: ModelSpec::execution_only_keys).
  nlohmann::json model_config;
  std::vector<std::string> execution_only_keys;
  // A LoRA run: the base it loaded (StateInfo::lora_base), which a LoRA checkpoint's must equal;
  // its frozen params come from that base, not from the checkpoint. Null: not a LoRA run.
  nlohmann::json lora_base;
  // A full fine-tuning preference run: its reference (StateInfo::preference_reference), which a
  // training checkpoint's must equal; a model-only checkpoint is refused. Null: none.
  nlohmann::json preference_reference;
  // training.ema: the EMA to load the checkpoint's shadows into (it must hold them); null: the run
  // keeps none (a checkpoint holding them is refused).
  Ema* ema = nullptr;
  // state_load_weights (`eval --ema`, `sample --ema`): the trained params' EMA shadows in place of
  // their weights (the checkpoint must hold them).
  bool weights_from_ema = false;
};

struct StateLoaded {
  std::string dir;                      // the iter_N directory read
  int64_t iteration = 0;                // where the run continues (0 after a model-only checkpoint)
  bool model_only = false;
  int saved_world_size = 0;
  std::vector<std::string> saved_nodes;  // the node of each saving rank; empty when not recorded
  std::string lineage;                   // its trainer_state.json "lineage" ("" when it records none)
  std::vector<BestCheckpoint> best;      // training.keep_best's list so far (checkpoint/best_checkpoints.h)
  nlohmann::json held_out;               // its trainer_state.json "held_out" (data.validation_split's draw), or null
};

// Loads a checkpoint (an iter_N directory or a save root with `latest`) on any world size: the
// model always, the optimizer and RNG unless options say not to. Fails naming the checkpoint
// when it holds another model, another global batch size, or misses or mis-shapes a tensor.
StateLoaded state_load(const std::string& path, Comm& comm, Model& model, Fsdp& fsdp, Optimizer& optimizer,
                       const StateLoadOptions& options);

// The weights alone, for an evaluation (`mmtrain eval`): the model id and model.config checked as
// for a resume, any global batch size, no optimizer, no RNG. A model-only checkpoint is iteration 0.
StateLoaded state_load_weights(const std::string& path, Model& model, Fsdp& fsdp, const StateLoadOptions& options);

// Only the model: params and buffers from a checkpoint reader (any world size), shapes checked.
// frozen_from_base: a LoRA run's frozen params are its base's, already loaded, and not read.
void state_load_model(const CheckpointReader& reader, Model& model, Fsdp& fsdp, bool frozen_from_base = false,
                      bool from_ema = false);

}  // namespace mmtrain
