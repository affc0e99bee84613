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
#pragma once
#include <ATen/ATen.h>

#include <map>
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

// The keys of DpoLoss::metric_sums, in a fixed order (for reductions over ranks).
const std::vector<std::string>& dpo_metric_names();

struct DpoLoss {
  at::Tensor loss;                        // scalar, with grad
  std::map<std::string, double> metric_sums;  // the keys above, and "pairs"
};

DpoLoss dpo_loss(const DpoConfig& config, const PairLogProbs& pairs);

}  // namespace mmtrain
