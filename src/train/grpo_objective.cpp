#include "train/grpo_objective.h"

#include "config/registries.h"
#include "core/error.h"
#include "data/conversation/prompt_dataset.h"
#include "nn/grpo_loss.h"

namespace mmtrain {

namespace {

// The batch the model sees: the completions' rows, asking for per-token log-probs.
Batch token_log_probs_request(const GrpoConfig& grpo, const Batch& batch) {
  Batch asking;
  for (const auto& [key, tensor] : batch)
    if (key.rfind("grpo_", 0) != 0) asking[key] = tensor;
  asking[kTokenLogProbsKey] = at::tensor({grpo.temperature}, at::kDouble);
  return asking;
}

const at::Tensor& token_log_probs_of(const ModelOutput& out) {
  if (!out.token_log_probs.defined())
    fail("training.objective grpo: the model gave no per-token log-probs (", kTokenLogProbsKey, ")");
  return out.token_log_probs;
}

}  // namespace

ModelOutput grpo_forward(const GrpoConfig& grpo, Model& model, Fsdp& fsdp, const Batch& batch) {
  fsdp.begin_forward();
  const ModelOutput policy = model.forward(token_log_probs_request(grpo, batch));
  GrpoTokens tokens;
  tokens.log_probs = token_log_probs_of(policy);
  tokens.entropies = policy.token_entropies;
  tokens.mask = batch_get(batch, kGrpoMaskKey);
  tokens.completion = batch_get(batch, kGrpoCompletionKey);
  tokens.advantages = batch_get(batch, kGrpoAdvantagesKey);
  if (const auto it = batch.find(kGrpoOldLogProbsKey); it != batch.end()) tokens.old_log_probs = it->second;
  if (const auto it = batch.find(kGrpoRefLogProbsKey); it != batch.end()) tokens.ref_log_probs = it->second;
  tokens.dapo_divisor = batch_get(batch, kGrpoDapoDivisorKey).item<double>();
  GrpoLoss loss = grpo_loss(grpo, tokens);
  ModelOutput out;
  out.loss = loss.loss;
  out.tokens = policy.tokens;
  out.metrics = std::move(loss.metric_sums);
  return out;
}

at::Tensor policy_token_log_probs(const GrpoConfig& grpo, Model& model, Fsdp& fsdp, const Batch& batch) {
  at::NoGradGuard no_grad;
  fsdp.begin_forward();
  const ModelOutput out = model.forward(token_log_probs_request(grpo, batch));
  fsdp.finish_forward_only();
  return token_log_probs_of(out);
}

at::Tensor reference_token_log_probs(const GrpoConfig& grpo, Model& model, Fsdp& fsdp, PreferenceReference* reference,
                                     const Batch& batch) {
  const Batch asking = token_log_probs_request(grpo, batch);
  return token_log_probs_of(reference_forward_only(model, fsdp, reference, [&](Model& m) { return m.forward(asking); }));
}

void check_grpo_config(const Config& config) {
  const std::string where = "config " + config.source_path + ": training.objective grpo";
  const auto& t = config.training;
  const auto& g = t.grpo;
  if (config_model_spec(config).dpo_form != "log_probs")
    fail(where, ": model '", config.model.model_id, "' does not generate tokens (GRPO trains a language model)");
  if (config.data.dataset_type != conversation::kPromptsDatasetType)
    fail(where, ": data.dataset_param.dataset_type must be ", conversation::kPromptsDatasetType, " (prompts with their fields), found '",
         config.data.dataset_type, "'");
  if (config.data.collate_model_name != "prompts")
    fail(where, ": data.dataloader_param.collator_id must be prompts, found '", config.data.collate_model_name, "'");
  if (config.data.loader.micro_batch_tokens > 0)
    fail(where, ": data.dataloader_param.micro_batch_tokens: a micro-batch is micro_batch_size prompts' completions "
         "(unset micro_batch_tokens)");
  const auto& p = config.parallel;
  if (p.ring_attention_size > 1 || p.ulysses_parallel_size > 1)
    fail(where, ": parallel.ring_attention_size = ", p.ring_attention_size, " and ulysses_parallel_size = ",
         p.ulysses_parallel_size, ": the rollouts' KV cache is not split over ranks; set both to 1");
  if (config.features.enable_lora && !config.features.lora.modules_to_save.empty() && g.beta > 0)
    fail(where, " with features.lora.modules_to_save and beta > 0: the reference would compute those modules as ",
         "trained, not as the base (leave modules_to_save empty, or beta 0)");
  if (config.features.enable_lora && t.dpo.reference_quant != "none")
    fail(where, ": training.dpo.reference_quant quantizes full fine-tuning's reference copy; under LoRA the reference ",
         "is the base, stored as features.lora.base_quant says (set that instead)");
  const int64_t mu = g.num_iterations;
  if (mu > 1) {
    // A rollout is never cut by a checkpoint: a resume starts at a rollout's first step, and its
    // prompts and seeds make it again (its old policy is the checkpoint's weights).
    if (t.train_iters % mu != 0)
      fail(where, ": training.train_iters ", t.train_iters, " is not a multiple of grpo.num_iterations ", mu,
           " (each rollout trains num_iterations steps)");
    if (t.save_interval > 0 && t.save_interval % mu != 0)
      fail(where, ": training.save_interval ", t.save_interval, " is not a multiple of grpo.num_iterations ", mu,
           " (a checkpoint is taken between rollouts)");
    if (t.exit_interval > 0 && t.exit_interval % mu != 0)
      fail(where, ": training.exit_interval ", t.exit_interval, " is not a multiple of grpo.num_iterations ", mu);
    if (t.keep_best > 0 || t.eval_interval > 0)
      fail(where, " with num_iterations > 1: held-out evaluation (eval_interval, keep_best) is not implemented for grpo");
  }
  if (t.eval_interval > 0 || t.eval_at_start)
    fail(where, ": held-out evaluation (training.eval_interval, eval_at_start) is not implemented for grpo (the ",
         "rewards of held-out prompts are not measured yet)");
}

int64_t data_step_of(const Config& config, int64_t step) {
  return config.training.objective == "grpo" ? step / config.training.grpo.num_iterations : step;
}

}  // namespace mmtrain
