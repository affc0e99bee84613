// What a training step minimizes (training.objective):
//   sft  the model's own loss on the batch: imitating the data (the default)
//   grpo GRPO from rewards (train/grpo_objective.h): the micro-batches are a rollout's completions
//   dpo  preference optimization (nn/preference_loss.h): each micro-batch holds P pairs as rows
//        (or packed samples) [chosen_0 .. chosen_{P-1}, rejected_0 .. rejected_{P-1}]
//        (models/model.h's kPreferencePairsKey). The model's spec says how a pair is scored
//        (ModelSpec::dpo_form): a language model's answers by their log-probabilities (DPO), a
//        flow-matching model's clips by their flow-matching errors (Flow-DPO).
// The reference: under LoRA, the same model with its adapters off, a no-grad forward through the
// same FSDP units before the policy's, so there is no second copy; its identity is the LoRA
// base's, checked on every resume (train/lora_base.h). Under full fine-tuning, a frozen sharded
// copy of the initial weights (train/preference_reference.h).
#pragma once
#include "config/config.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "train/preference_reference.h"

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace mmtrain {

// One micro-batch's forward under an objective, FSDP's forward begun inside (a reference forward
// runs as a forward-only pass of its own first): the loss backward runs on, the tokens, and the
// metric sums the step adds up over micro-batches and ranks (ModelOutput::metrics).
using MicroBatchForward = std::function<ModelOutput(Model& model, Fsdp& fsdp, const Batch& batch)>;

// The objective config.training names: null for sft (the model's loss), else its forward.
// reference: the frozen copy when config_needs_reference_copy(config) (it must then be given), else null.
MicroBatchForward objective_forward(const Config& config, std::shared_ptr<PreferenceReference> reference);

// Refuses, by name and before anything is built, an objective with a setting it does not support
// (dpo: a model without a preference form, modules_to_save, a loss type or
// term_weights the model's form has not).
void check_objective(const Config& config);
// Refuses, by name, a micro-batch of preference pairs (models/model.h's kPreferencePairsKey) under
// sft: the data set's pairs are known only once collated.
void check_sft_batch(const Batch& batch);

// The step's objective metrics (TRL's names) from their sums over its micro-batches and ranks:
// each divided by the pair count (dpo) or the masked completion tokens (grpo); null for sft.
nlohmann::json objective_metrics(const std::map<std::string, double>& sums);

// The names of the metrics config's objective reports (nn/preference_loss.h), in a fixed order.
const std::vector<std::string>& objective_metric_names(const Config& config);

}  // namespace mmtrain
