#include "train/objective.h"

#include "core/error.h"
#include "config/registries.h"
#include "nn/preference_loss.h"
#include "nn/grpo_loss.h"
#include "train/grpo_objective.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace mmtrain {

namespace {

// The pair count P of a preference micro-batch, checked against its 2P rows.
int64_t pairs_of(const Batch& batch) {
  const auto found = batch.find(kPreferencePairsKey);
  if (found == batch.end())
    fail("training.objective dpo: the micro-batch holds no preference pairs (batch key '", kPreferencePairsKey,
         "'): use preference data (docs/preference.md)");
  return found->second.item<int64_t>();
}

// How pairs are scored: each sequence's log-probability (a language model) or each clip's error
// Σ_k w_k × (its term k loss) (a flow-matching model), [2P] in the batch's order.
struct PairScoring {
  std::string form;                  // ModelSpec::dpo_form
  std::vector<double> term_weights;  // flow: training.dpo.term_weights (empty: all 1)

  ModelOutput forward(Model& model, const Batch& batch, int64_t pairs) const {
    Batch asking = batch;
    asking[form == "flow" ? kSampleTermLossesKey : kSequenceLogProbsKey] = at::ones({1});
    ModelOutput out = model.forward(asking);
    const at::Tensor& scores = form == "flow" ? out.sample_term_losses : out.sequence_log_probs;
    if (!scores.defined()) fail("training.objective dpo: the model gave no per-sequence scores (", form, ")");
    if (scores.size(0) != 2 * pairs)
      fail("training.objective dpo: ", scores.size(0), " sequences in a micro-batch of ", pairs, " pairs (expected ",
           2 * pairs, ")");
    return out;
  }

  // Each clip's error e [2P] from its per-term losses [2P, terms].
  at::Tensor clip_errors(const ModelOutput& out) const {
    const int64_t terms = out.sample_term_losses.size(1);
    if (!term_weights.empty() && static_cast<int64_t>(term_weights.size()) != terms)
      fail("training.dpo.term_weights: ", term_weights.size(), " weights for the model's ", terms,
           " loss terms (one each, in the order of its eval_loss_<term> records)");
    const auto weights = term_weights.empty()
                             ? at::ones({terms}, out.sample_term_losses.options())
                             : at::tensor(term_weights, at::kDouble).to(out.sample_term_losses.options());
    return (out.sample_term_losses * weights).sum(1);
  }
};

ModelOutput dpo_forward(const DpoConfig& config, const PairScoring& scoring, PreferenceReference* reference,
                        Model& model, Fsdp& fsdp, const Batch& batch) {
  const int64_t pairs = pairs_of(batch);
  const ModelOutput ref =
      reference_forward_only(model, fsdp, reference, [&](Model& m) { return scoring.forward(m, batch, pairs); });
  fsdp.begin_forward();
  const ModelOutput policy = scoring.forward(model, batch, pairs);
  const std::optional<double> pair_normalizer = loss_normalizer(batch, 0);  // a token-budget step's global pairs
  DpoLoss loss;
  if (scoring.form == "flow") {
    const auto errors = scoring.clip_errors(policy), ref_errors = scoring.clip_errors(ref);
    PairFlowErrors e;
    e.chosen = errors.narrow(0, 0, pairs);
    e.rejected = errors.narrow(0, pairs, pairs);
    e.ref_chosen = ref_errors.narrow(0, 0, pairs);
    e.ref_rejected = ref_errors.narrow(0, pairs, pairs);
    loss = flow_dpo_loss(config, e, pair_normalizer);
  } else {
    PairLogProbs p;
    p.chosen = policy.sequence_log_probs.narrow(0, 0, pairs);
    p.rejected = policy.sequence_log_probs.narrow(0, pairs, pairs);
    p.ref_chosen = ref.sequence_log_probs.narrow(0, 0, pairs);
    p.ref_rejected = ref.sequence_log_probs.narrow(0, pairs, pairs);
    p.chosen_tokens = policy.sequence_tokens.narrow(0, 0, pairs);
    p.rejected_tokens = policy.sequence_tokens.narrow(0, pairs, pairs);
    loss = dpo_loss(config, p, pair_normalizer);
  }
  ModelOutput out;
  out.loss = loss.loss;
  out.tokens = policy.tokens;
  out.metrics = std::move(loss.metric_sums);
  return out;
}

}  // namespace

MicroBatchForward objective_forward(const Config& config, std::shared_ptr<PreferenceReference> reference) {
  if (config.training.objective == "sft") return nullptr;
  if (config_needs_reference_copy(config) != static_cast<bool>(reference))
    fail("objective_forward: training.objective ", config.training.objective,
         reference ? " takes no reference copy here" : " under full fine-tuning needs its reference copy");
  // GRPO's reference is used by the rollout (train/rollout_source.h), which puts its log-probs in the batch.
  if (config.training.objective == "grpo")
    return [grpo = config.training.grpo](Model& model, Fsdp& fsdp, const Batch& batch) {
      return grpo_forward(grpo, model, fsdp, batch);
    };
  const DpoConfig dpo = config.training.dpo;
  const PairScoring scoring{config_model_spec(config).dpo_form, dpo.term_weights};
  return [dpo, scoring, reference](Model& model, Fsdp& fsdp, const Batch& batch) {
    return dpo_forward(dpo, scoring, reference.get(), model, fsdp, batch);
  };
}

void check_objective(const Config& config) {
  if (config.training.objective == "sft") return;  // pairs under sft: check_sft_batch
  if (config.training.objective == "grpo") return check_grpo_config(config);
  const std::string where = "config " + config.source_path + ": training.objective " + config.training.objective;
  const std::string& form = config_model_spec(config).dpo_form;
  if (form.empty()) fail(where, ": model '", config.model.model_id, "' has no preference objective");
  if (config.features.enable_lora && config.training.dpo.reference_quant != "none")
    fail(where, ": training.dpo.reference_quant quantizes full fine-tuning's reference copy; under LoRA the reference ",
         "is the base, stored as features.lora.base_quant says (set that instead)");
  if (!config.features.lora.modules_to_save.empty() && config.features.enable_lora)
    fail(where, " with features.lora.modules_to_save: the reference would compute those modules as trained, not as ",
         "the base (leave modules_to_save empty)");
  if (form == "flow") {
    const auto& allowed = flow_dpo_loss_types();
    for (const auto& type : config.training.dpo.loss_type)
      if (std::find(allowed.begin(), allowed.end(), type) == allowed.end())
        fail(where, ": training.dpo.loss_type '", type, "' has no Flow-DPO form for model '", config.model.model_id,
             "' (it divides by answer token counts); use sigmoid, hinge, robust or sft");
  } else if (!config.training.dpo.term_weights.empty()) {
    fail(where, ": training.dpo.term_weights weighs a flow-matching model's loss terms; model '",
         config.model.model_id, "' scores answers by their log-probabilities (remove the key)");
  }
}

void check_sft_batch(const Batch& batch) {
  // SFT on pairs would imitate the rejected answers as much as the chosen ones.
  if (batch.count(kPreferencePairsKey))
    fail("training.objective sft: the micro-batch holds preference pairs (a preference data set and collator); ",
         "pairs train with training.objective dpo, not sft");
}

nlohmann::json objective_metrics(const std::map<std::string, double>& sums) {
  // GRPO's per-token metrics: means over the step's masked completion tokens.
  if (const auto tokens = sums.find(kGrpoTokenCountMetric); tokens != sums.end()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, sum] : sums)
      if (key != kGrpoTokenCountMetric) out[key] = tokens->second > 0 ? sum / tokens->second : 0.0;
    return out;
  }
  const auto pairs = sums.find(kPairCountMetric);
  if (pairs == sums.end()) return nullptr;
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, sum] : sums)
    if (key != kPairCountMetric) out[key] = sum / pairs->second;
  return out;
}

const std::vector<std::string>& objective_metric_names(const Config& config) {
  if (config.training.objective == "grpo") return grpo_token_metric_names(config.training.grpo);
  return dpo_metric_names(config_model_spec(config).dpo_form == "flow");
}

}  // namespace mmtrain
