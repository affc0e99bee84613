// What a training step minimizes (training.objective):
//   sft  the model's own loss on the batch: imitating the data (the default)
//   dpo  direct preference optimization (nn/preference_loss.h): each micro-batch holds P pairs of
//        one prompt's chosen and rejected answers as rows [chosen_0 .. chosen_{P-1}, rejected_0 ..
//        rejected_{P-1}] (models/model.h's kPreferencePairsKey, data/conversation/preference_collator.h).
//        The reference is the same model with its LoRA adapters off (nn/lora.h): a no-grad forward
//        through the same FSDP units before the policy's, so there is no second copy of the model;
//        its identity is the LoRA base's, checked on every resume (train/lora_base.h).
#pragma once
#include "config/config.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <string>

namespace mmtrain {

// One micro-batch's forward under an objective, FSDP's forward begun inside (a reference forward
// runs as a forward-only pass of its own first): the loss backward runs on, the tokens, and the
// metric sums the step adds up over micro-batches and ranks (ModelOutput::metrics).
using MicroBatchForward = std::function<ModelOutput(Model& model, Fsdp& fsdp, const Batch& batch)>;

// The objective config.training names: null for sft (the model's loss), else its forward.
MicroBatchForward objective_forward(const Config& config);

// Refuses, by name and before anything is built, an objective with a setting it does not support
// (dpo: without LoRA, with modules_to_save, token budgets; sft: preference pairs).
void check_objective(const Config& config);

// The step's objective metrics (TRL's names) from their sums over its micro-batches and ranks:
// each divided by the pair count; null for sft.
nlohmann::json objective_metrics(const std::map<std::string, double>& sums);

}  // namespace mmtrain
