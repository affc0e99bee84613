// training.objective grpo: what a step trains on and how. A step's micro-batches are a rollout's
// (train/rollout_source.h, made by rl/rollout.h): each a packed row of completions, prompt and completion, with per-row keys
//   grpo_mask        fp32 [L]   1 on the rows that predict a completion token that trains
//   grpo_completion  int64 [L]  the completion each row belongs to
//   grpo_advantages  fp32 [N]   each completion's advantage
//   grpo_old_log_probs, grpo_ref_log_probs  fp32 [L]  the rollout policy's (num_iterations > 1) and
//                               the reference's (beta > 0) per-token log-probs
//   grpo_dapo_divisor float64 [1]  the step's masked completion tokens over all ranks / (its
//                               micro-batches per rank × data-parallel ranks), at least 1 (dapo)
// and the objective's forward is the model's per-token log-probs at the sampling temperature
// (models/model.h kTokenLogProbsKey) into nn/grpo_loss.h. docs/grpo.md.
#pragma once
#include "config/config.h"
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "train/preference_reference.h"

#include <memory>

namespace mmtrain {

inline constexpr const char* kGrpoMaskKey = "grpo_mask";
inline constexpr const char* kGrpoCompletionKey = "grpo_completion";
inline constexpr const char* kGrpoAdvantagesKey = "grpo_advantages";
inline constexpr const char* kGrpoOldLogProbsKey = "grpo_old_log_probs";
inline constexpr const char* kGrpoRefLogProbsKey = "grpo_ref_log_probs";
inline constexpr const char* kGrpoDapoDivisorKey = "grpo_dapo_divisor";

// The forward of one micro-batch of completions, FSDP's forward begun inside.
ModelOutput grpo_forward(const GrpoConfig& grpo, Model& model, Fsdp& fsdp, const Batch& batch);

// The per-token log-probs [L] of a micro-batch of completions under the policy (no grad), or the
// reference (preference_reference.h's reference_forward_only).
at::Tensor policy_token_log_probs(const GrpoConfig& grpo, Model& model, Fsdp& fsdp, const Batch& batch);
at::Tensor reference_token_log_probs(const GrpoConfig& grpo, Model& model, Fsdp& fsdp, PreferenceReference* reference,
                                     const Batch& batch);

// Refuses, by name and before anything is built, a grpo config this objective cannot train.
void check_grpo_config(const Config& config);

// The data step (the loader's step) of optimizer step `step`: a rollout's prompts serve
// num_iterations steps (1 for other objectives).
int64_t data_step_of(const Config& config, int64_t step);

}  // namespace mmtrain
