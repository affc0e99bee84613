// A LoRA run's identity, which its checkpoints record (trainer_state.json "lora_base") and every
// reader of them compares before applying the adapters: the base they sit on (its fingerprint, or
// the seed of its random init) and what makes the adapters compute what they computed in training
// (rank, alpha, use_rslora, target_modules, modules_to_save, and base_quant: the base they were
// trained over, as the model computed with it). Resume, `mmtrain eval`, `debug step`,
// `merge-lora` and `lora-to-peft` refuse any difference by name (docs/lora.md).
#pragma once
#include "config/config.h"
#include "dist/comm.h"

#include <nlohmann/json.hpp>

#include <string>

namespace mmtrain {

// The weights a run starts from, as an identity its checkpoints can record:
//   {"weights": path, "fingerprint": weights_fingerprint(path), "fingerprint_of": "sha256 of every
//    byte"} or, without model weights, {"init_seed": seed}.
// With comm, rank 0 alone reads the weights and every rank gets the fingerprint (collective).
nlohmann::json initial_weights_identity(const Config& config, Comm* comm = nullptr);

// A LoRA run's base and adapters, as its checkpoints record them (StateInfo::lora_base):
//   {"weights": path, "fingerprint": weights_fingerprint(path), "fingerprint_of": "sha256 of every
//    byte"} or, without model weights, {"init_seed": seed}; with
//   "adapters": lora_adapters(features.lora)
// null when features.enable_lora is off. With comm, rank 0 alone reads the base for its
// fingerprint and every rank gets it (collective); without, this process reads it.
nlohmann::json lora_base(const Config& config, Comm* comm = nullptr);
// What makes adapters mean what they meant when trained: rank, alpha, use_rslora, target_modules,
// modules_to_save and base_quant (adapter_dtype, like param_dtype, is how they are computed and may change).
nlohmann::json lora_adapters(const LoraConfig& lora);
// The adapters a checkpoint's trainer_state.json describes: its lora_base's "adapters", or (a
// checkpoint from before they were recorded) its config's features.lora.
nlohmann::json lora_adapters_of_checkpoint(const nlohmann::json& trainer_state);
// "" when a LoRA checkpoint's adapters (saved) are the ones config's features.lora builds (run);
// else a sentence naming the first key that differs and both values.
std::string lora_adapters_difference(const nlohmann::json& saved, const nlohmann::json& run);
// "" when a LoRA checkpoint's base (saved lora_base) is run's; else why not.
std::string lora_base_difference(const nlohmann::json& saved, const nlohmann::json& run);
std::string lora_base_describe(const nlohmann::json& base);

}  // namespace mmtrain
