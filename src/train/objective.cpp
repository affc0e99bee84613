#include "train/objective.h"

#include "core/error.h"
#include "nn/lora.h"
#include "nn/preference_loss.h"

#include <ATen/ATen.h>

namespace mmtrain {

namespace {

// The pair count P of a preference micro-batch, checked against its 2P rows.
int64_t pairs_of(const Batch& batch) {
  const auto found = batch.find(kPreferencePairsKey);
  if (found == batch.end())
    fail("training.objective dpo: the micro-batch holds no preference pairs (batch key '", kPreferencePairsKey,
         "'): use preference data (data.dataset_param.dataset_type preference, collator preference; docs/preference.md)");
  return found->second.item<int64_t>();
}

// The model's per-sequence log-probs of the batch (models/model.h), split into the pairs' halves.
ModelOutput sequence_forward(Model& model, const Batch& batch, int64_t pairs) {
  Batch asking = batch;
  asking[kSequenceLogProbsKey] = at::ones({1});
  ModelOutput out = model.forward(asking);
  if (!out.sequence_log_probs.defined())
    fail("training.objective dpo: this model gives no per-sequence log-probs (dpo is for language models; Flow-DPO ",
         "for a diffusion model is not implemented yet)");
  if (out.sequence_log_probs.size(0) != 2 * pairs)
    fail("training.objective dpo: ", out.sequence_log_probs.size(0), " sequences in a micro-batch of ", pairs,
         " pairs (expected ", 2 * pairs, ")");
  return out;
}

ModelOutput dpo_forward(const DpoConfig& config, Model& model, Fsdp& fsdp, const Batch& batch) {
  const int64_t pairs = pairs_of(batch);
  ModelOutput reference;
  {
    at::NoGradGuard no_grad;
    const LoraAdaptersOff base;
    fsdp.begin_forward();
    reference = sequence_forward(model, batch, pairs);
    fsdp.finish_forward_only();
  }
  fsdp.begin_forward();
  ModelOutput policy = sequence_forward(model, batch, pairs);
  PairLogProbs p;
  p.chosen = policy.sequence_log_probs.narrow(0, 0, pairs);
  p.rejected = policy.sequence_log_probs.narrow(0, pairs, pairs);
  p.ref_chosen = reference.sequence_log_probs.narrow(0, 0, pairs);
  p.ref_rejected = reference.sequence_log_probs.narrow(0, pairs, pairs);
  p.chosen_tokens = policy.sequence_tokens.narrow(0, 0, pairs);
  p.rejected_tokens = policy.sequence_tokens.narrow(0, pairs, pairs);
  DpoLoss loss = dpo_loss(config, p);
  ModelOutput out;
  out.loss = loss.loss;
  out.tokens = policy.tokens;
  out.metrics = std::move(loss.metric_sums);
  return out;
}

}  // namespace

MicroBatchForward objective_forward(const Config& config) {
  if (config.training.objective == "sft") return nullptr;
  const DpoConfig dpo = config.training.dpo;
  return [dpo](Model& model, Fsdp& fsdp, const Batch& batch) { return dpo_forward(dpo, model, fsdp, batch); };
}

void check_objective(const Config& config) {
  if (config.training.objective == "sft") {
    // SFT on pairs would imitate the rejected answers as much as the chosen ones.
    if (config.data.dataset_type == "preference" || config.data.collate_model_name == "preference")
      fail("config ", config.source_path, ": preference pairs (dataset_type / collator preference) train with ",
           "training.objective dpo, not sft");
    return;
  }
  const std::string where = "config " + config.source_path + ": training.objective " + config.training.objective;
  if (!config.features.enable_lora)
    fail(where, " needs features.enable_lora: the reference is the base with the adapters off (a frozen reference ",
         "copy for full fine-tuning is not implemented yet)");
  if (!config.features.lora.modules_to_save.empty())
    fail(where, " with features.lora.modules_to_save: the reference would compute those modules as trained, not as ",
         "the base (leave modules_to_save empty)");
  if (config.data.loader.micro_batch_tokens > 0)
    fail(where, " with data.dataloader_param.micro_batch_tokens: token-budget micro-batches of preference pairs are "
         "not implemented yet (use micro_batch_size pairs)");
}

nlohmann::json objective_metrics(const std::map<std::string, double>& sums) {
  const auto pairs = sums.find(kPairCountMetric);
  if (pairs == sums.end()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, sum] : sums)
    if (key != kPairCountMetric) out[key] = sum / pairs->second;
  return out;
}

}  // namespace mmtrain
