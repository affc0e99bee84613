// Direct preference optimization's losses (DPO, Rafailov et al. 2023) as TRL's DPOTrainer computes
// them (trl 1.16, the reverse-KL default), from each sequence's log-probability under the policy
// and the reference: the training.dpo section. For a pair (chosen w, rejected l) of one prompt,
//   δ = (log π(w) - log π_ref(w)) - (log π(l) - log π_ref(l))       log π: Σ over the answer's tokens
//   sigmoid       -log σ(β δ)
//   hinge         max(0, 1 - β δ)
//   ipo           (δ' - 1 / (2β))²      δ' with each log-ratio divided by its answer's token count
//   sigmoid_norm  -log σ(β δ')
//   robust        (-(1 - ε) log σ(β δ) + ε log σ(-β δ)) / (1 - 2ε)      ε = label_smoothing
//   sft           -(Σ chosen log π) / (chosen answer tokens): the NLL of the chosen answers, over the
//                 micro-batch (RPO's term; TRL < 1.0's rpo_alpha)
// Each micro-batch's loss is Σ_k weight_k × (mean over its pairs of loss_type_k), as TRL's.
//
// Flow-DPO (Diffusion-DPO, Wallace et al. 2023, in the flow-matching form of Liu et al. 2025) for a
// diffusion model: the two clips of a pair are noised with one timestep and one noise, and each
// clip's error e = Σ_k term_weight_k × mean over term k's elements of (v - v_θ(x_t))² stands in
// for -log π, so that
//   δ = -(e_θ(w) - e_ref(w)) + (e_θ(l) - e_ref(l))
//   sigmoid       -log σ(β/2 · δ)     = -log σ(-β/2 [(e_θ(w) - e_ref(w)) - (e_θ(l) - e_ref(l))])
//   hinge, robust as above with β/2 in β's place
//   sft           the mean of e_θ(w): the flow-matching loss of the chosen clips
// (ipo and sigmoid_norm divide by token counts, which a clip's error has not: refused.)
#pragma once
#include <ATen/ATen.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

template <typename S>
class ConfigSection;

struct DpoConfig {
  double beta = 0.1;                                // β: how far the policy may move from the reference
  std::vector<std::string> loss_type = {"sigmoid"}; // summed with loss_weights (TRL's list form)
  std::vector<double> loss_weights;                 // one per loss_type; empty: all 1
  double label_smoothing = 0.0;                     // robust: the share of preferences assumed flipped, [0, 0.5)
  double rpo_alpha = 0.0;                           // > 0: adds loss_type sft with this weight
  std::vector<double> term_weights;                 // Flow-DPO: one per model loss term (MagiHuman: video, audio); empty: all 1
  // Full fine-tuning: how the frozen reference copy stores its Linear weights (none | nf4 | int8 |
  // fp8_e4m3, as features.lora.base_quant stores QLoRA's base; train/preference_reference.h).
  std::string reference_quant = "none";

  static void declare(ConfigSection<DpoConfig>& section);
};

// The log-probabilities of a micro-batch's P pairs, fp32 [P] each.
struct PairLogProbs {
  at::Tensor chosen, rejected;          // the policy's, with grad
  at::Tensor ref_chosen, ref_rejected;  // the reference's, no grad
  at::Tensor chosen_tokens, rejected_tokens;  // each answer's supervised tokens
};

// TRL's metric names for the step's log, as sums over the micro-batch's pairs (the step divides
// the sums over all micro-batches and ranks by "pairs"): rewards/chosen = β (log π(w) - log π_ref(w)),
// rewards/rejected likewise, rewards/accuracies = [reward chosen > reward rejected], rewards/margins,
// logps/chosen, logps/rejected.
inline constexpr const char* kPairCountMetric = "pairs";

// Flow-DPO logs mse/chosen and mse/rejected (the policy's e) in place of the logps.
// The keys of DpoLoss::metric_sums, in a fixed order (for reductions over ranks).
const std::vector<std::string>& dpo_metric_names(bool flow);

struct DpoLoss {
  at::Tensor loss;                        // scalar, with grad
  std::map<std::string, double> metric_sums;  // the keys above, and "pairs"
};

// pair_normalizer: a token-budget step's pair count over its whole global batch (models/model.h's
// loss_normalizer): each loss type's mean over the micro-batch's pairs becomes their sum over it, so
// that the step adds up to the mean over every pair. nullopt: the micro-batch's mean.
DpoLoss dpo_loss(const DpoConfig& config, const PairLogProbs& pairs, std::optional<double> pair_normalizer = {});

// The loss types Flow-DPO computes.
const std::vector<std::string>& flow_dpo_loss_types();

// Each clip's error e (above), fp32 [P] each.
struct PairFlowErrors {
  at::Tensor chosen, rejected;          // the policy's, with grad
  at::Tensor ref_chosen, ref_rejected;  // the reference's, no grad
};

DpoLoss flow_dpo_loss(const DpoConfig& config, const PairFlowErrors& pairs, std::optional<double> pair_normalizer = {});

}  // namespace mmtrain
