#include "plan/plan_estimate.h"

#include "config/registries.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "optim/swapped_state.h"
#include "optim/adamw8bit.h"
#include "plan/sampling_plan.h"

#include <c10/core/ScalarType.h>

#include <algorithm>

namespace mmtrain {

namespace {

// A model's estimate multiplies tokens by widths in int64: with the tokens bounded (kMaxTokens) a
// real model stays far inside it, and an absurd model.config that still wraps shows as a negative
// size here, named instead of planned.
void require_sane_estimate(const ActivationEstimate& a, const std::string& what) {
  for (const int64_t bytes : {a.layers_full_bytes, a.max_layer_full_bytes, a.layer_inputs_bytes, a.outside_bytes,
                              a.backward_bytes})
    if (bytes < 0) fail(what, ": the model's activation estimate overflows int64 (model.config's sizes are too large)");
  checked_add(checked_add(a.layers_full_bytes, a.outside_bytes, what), a.backward_bytes, what);
  checked_add(checked_add(a.layer_inputs_bytes, a.max_layer_full_bytes, what),
              checked_add(a.outside_bytes, a.backward_bytes, what), what);
}

}  // namespace

int64_t ema_shadow_bytes(const Config& cfg, const FsdpMemoryPlan& plan) {
  return cfg.training.ema.enable ? plan.grad_bytes : 0;  // one fp32 value per trained shard element, as the grads
}

int64_t optimizer_state_bytes(const Config& cfg, Module& model, const FsdpMemoryPlan& plan, int fsdp_size) {
  if (cfg.training.optimizer != "adamw8bit") return plan.optimizer_bytes;
  std::vector<ShardedParamSpan> spans;  // rank 0's: it holds the fullest shard of every param
  for (const auto& [name, param] : model.named_parameters()) {
    if (!param->trainable || !param->requires_grad) continue;
    const ShardLayout layout(param->shape, fsdp_size);
    ShardedParamSpan span{name, 0, layout.dim0 * layout.row_numel, {0, layout.rows(0) * layout.row_numel}};
    spans.push_back(std::move(span));
  }
  return AdamW8bit::state_bytes_for(plan.grad_bytes / 4, spans, 0, cfg.training.min_8bit_size);
}

int64_t ema_window_bytes(const Config& cfg, const FsdpMemoryPlan& plan, std::optional<int64_t> free_bytes) {
  if (!cfg.training.ema.enable || cfg.training.ema.offload == "none") return 0;
  return SwappedState::window_bytes_for(
      SwappedState::chunk_numel_for(cfg.training.mem_fraction_static, free_bytes, plan.largest_shard_numel(), 1), 1);
}

int64_t offload_window_bytes(const Config& cfg, const FsdpMemoryPlan& plan, std::optional<int64_t> free_bytes) {
  if (cfg.training.optimizer == "adamw8bit") return 2 * AdamW8bit::unit_state_bytes_estimate(plan.largest_shard_numel());
  return SwappedState::window_bytes_for(
      SwappedState::chunk_numel_for(cfg.training.mem_fraction_static, free_bytes, plan.largest_shard_numel(), 2), 2);
}

int64_t reference_copy_bytes(const Config& cfg, int fsdp_size) {
  if (!config_needs_reference_copy(cfg)) return 0;
  return fsdp_memory_plan(*build_reference_model(cfg), cfg.parallel.fsdp_plan, fsdp_size).param_bytes;
}

std::unique_ptr<PlanEstimate> plan_estimate(const Config& cfg, int world, int64_t seqlen, Module& model,
                                            const std::vector<std::pair<int64_t, int64_t>>& images,
                                            const std::vector<int64_t>& flops_seqlens) {
  auto e = std::make_unique<PlanEstimate>();
  e->images = images;
  e->flops_seqlens = flops_seqlens;
  e->cfg = cfg;
  e->dims = config_check_world(cfg, world);
  const auto& fp = cfg.parallel.fsdp_plan;
  const auto& id = cfg.model.model_id;
  e->spec = &model_spec(id, "config " + cfg.source_path + ": model.model_id");
  e->plan = fsdp_memory_plan(model, fp, e->dims.fsdp());
  e->plan.optimizer_bytes = optimizer_state_bytes(cfg, model, e->plan, e->dims.fsdp());
  e->recompute = cfg.features.recompute && !cfg.features.recompute_plan.apply_modules.empty();
  e->seqlen = checked_tokens(seqlen > 0 ? seqlen : e->spec->default_seqlen, "plan: the sequence length");
  e->micro = cfg.training.micro_batch_size;
  if (cfg.training.objective == "dpo") e->sequences_per_sample = 2;
  // grpo: a sample is a prompt, trained as its num_generations completions of up to
  // max_completion_length tokens after it.
  if (cfg.training.objective == "grpo") {
    e->sequences_per_sample = cfg.training.grpo.num_generations;
    e->completion_tokens = cfg.training.grpo.max_completion_length;
  }
  e->ema_bytes = ema_shadow_bytes(cfg, e->plan);
  e->reference_copy_bytes = reference_copy_bytes(cfg, e->dims.fsdp());
  for (const int64_t s : flops_seqlens) checked_tokens(s, "plan: a sample's length");
  // Token-budget micro-batches (data.dataloader_param.micro_batch_tokens) hold up to the budget
  // whatever the samples' lengths: the activations are those of one packed micro-batch of that
  // many tokens (seqlen still times the samples' FLOPs).
  const int64_t budget = cfg.data.loader.micro_batch_tokens;
  const int64_t act_seqlen = budget > 0 ? budget : e->seqlen + e->completion_tokens,
                act_micro = budget > 0 ? 1 : e->micro * e->sequences_per_sample;
  // Context parallelism splits a micro-batch's packed tokens over the CP ranks (padded to a
  // multiple of the degree): the activations are those of the local tokens.
  const int ring = e->dims.ring, ulysses = e->dims.ulysses, cp = e->dims.cp();
  const std::string sizing = "plan: the activations of " + std::to_string(act_micro) + " x " +
                             std::to_string(act_seqlen) + " tokens";
  e->tokens_per_rank = checked_tokens(checked_mul(act_micro, act_seqlen, sizing), sizing + " per micro-batch");
  e->tokens_per_rank = (e->tokens_per_rank + cp - 1) / cp;
  if (!e->spec->activations)
    e->no_activations = "no activation estimator for model '" + id + "'";
  else if (e->seqlen == 0)
    e->no_activations = "pass --seqlen to estimate activations";
  else if (cp == 1)
    e->act = e->spec->activations(ActivationQuery{cfg.model.config, act_seqlen, act_micro, fp.param_dtype, images});
  else
    e->act = e->spec->activations(ActivationQuery{cfg.model.config, e->tokens_per_rank, 1, fp.param_dtype, images});
  if (e->no_activations.empty()) require_sane_estimate(e->act, sizing);
  // The context-parallel buffers of one layer's attention (e = param_dtype bytes, T the local
  // tokens, T_r = U * T the ring chunk, q/kv widths per Ulysses rank):
  //   Ulysses: send + receive buffers of the q, k, v and output all-to-alls, 2 e T (2 q + 2 kv)
  //   ring forward: the k/v block held and the one arriving, 2 x 2 e T_r kv, and the fp32
  //     output accumulator 4 T_r q; backward: the same k/v pair, the fp32 dK/dV travelling
  //     (held and arriving, 2 x 2 x 4 T_r kv) and the fp32 dQ (4 T_r q): the larger of the two.
  if (cp > 1 && e->no_activations.empty()) {
    const int64_t bytes = static_cast<int64_t>(c10::elementSize(fp.param_dtype)), t = e->tokens_per_rank;
    const auto& act = e->act;
    const std::string what = "plan: the context-parallel buffers of " + std::to_string(t) + " tokens per rank";
    auto mul = [&](std::initializer_list<int64_t> factors) {
      int64_t product = 1;
      for (const int64_t f : factors) product = checked_mul(product, f, what);
      return product;
    };
    auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, what); };
    if (ulysses > 1) e->cp_buffer_bytes = add(e->cp_buffer_bytes, mul({2, bytes, t, add(2 * act.q_width, 2 * act.kv_width)}));
    if (ring > 1) {
      const int64_t tr = mul({ulysses, t}), q = act.q_width / ulysses, kv = std::max<int64_t>(act.kv_width / ulysses, 1);
      const int64_t forward = add(mul({2, 2, bytes, tr, kv}), mul({4, tr, q}));
      const int64_t backward = add(add(mul({2, 2, bytes, tr, kv}), mul({2, 2, 4, tr, kv})), mul({4, tr, q}));
      e->cp_buffer_bytes = add(e->cp_buffer_bytes, std::max(forward, backward));
    }
  }
  return e;
}

TierBytes PlanEstimate::evaluation_bytes() const {
  TierBytes out;
  if (!no_activations.empty() || act.num_layers == 0) return out;
  const auto& t = cfg.training;
  const bool budget = cfg.data.loader.micro_batch_tokens > 0;  // the estimate is of one budget-full micro-batch
  const double scale = budget ? 1.0 : static_cast<double>(t.eval_batch_size > 0 ? t.eval_batch_size : micro) / micro;
  const double forward = static_cast<double>(act.forward_only_bytes()) * scale;
  const int64_t step = recompute ? act.with_recompute_bytes() : act.without_recompute_bytes();
  out.device = std::max<int64_t>(0, static_cast<int64_t>(forward) - step);
  return out;
}

PhaseBytes PlanEstimate::phase_bytes(const OffloadSetting& setting, bool device_is_host) const {
  PhaseBytes phases = offload_phase_bytes(plan, setting, device_is_host, !cfg.features.enable_lora);
  phases.evaluation = evaluation_bytes();
  if (const auto sampling = plan_sampling(*this, nullptr, 1)) phases.sampling = sampling->beyond_step;
  if (const auto rollout = plan_rollout(*this, nullptr, 1)) phases.rollout = rollout->beyond_step;
  return phases;
}

OffloadPlanInputs PlanEstimate::offload_inputs() const {
  // The windows are those of the largest chunk; at run time training.mem_fraction_static of the
  // free memory may make them smaller.
  OffloadPlanInputs in;
  in.fsdp = &plan;
  in.other_device_bytes = cp_buffer_bytes + reference_copy_bytes;
  in.ema_bytes = ema_bytes;
  in.ema_offload = cfg.training.ema.offload;
  in.ema_window_bytes = ema_window_bytes(cfg, plan, std::nullopt);
  if (no_activations.empty()) {
    in.activation_bytes = recompute ? act.with_recompute_bytes() : act.without_recompute_bytes();
    in.layers_kept_bytes = recompute ? act.layer_inputs_bytes : act.layers_full_bytes;
    in.num_layers = act.num_layers;
  }
  in.window_bytes = offload_window_bytes(cfg, plan, std::nullopt);
  return in;
}

StepTimeInputs PlanEstimate::step_inputs(int devices_per_node, bool* flops) const {
  StepTimeInputs in;
  in.fsdp = &plan;
  in.dims = dims;
  in.devices_per_node = devices_per_node;
  in.micro_batch_size = micro;
  in.accumulation = config_accumulation(cfg, dims);
  in.recompute = recompute;
  in.offload = OffloadSetting::of(cfg);
  *flops = spec->flops && seqlen > 0;
  if (*flops) {
    FlopsQuery query;
    // (grpo: a sample's sequences are the prompt and a completion: completion_tokens, else 0.)
    query.seqlens = flops_seqlens.empty() ? std::vector<int64_t>{seqlen + completion_tokens} : flops_seqlens;
    if (flops_seqlens.empty()) query.images = images;  // the images of one sample
    const FlopsReport report = spec->flops(cfg.model.config, query);
    in.attention_flops_per_sample = report.attention_flops_per_sample;
    in.gemm_flops_per_sample = report.flops_per_sample - report.attention_flops_per_sample;
    // LoRA: the frozen base takes no weight gradients, so the backward's GEMMs are the input
    // gradients alone: forward + backward is 2 forwards, not 3 (plus the trained share's third).
    double train_passes = 3.0;  // forward + backward, in forwards
    if (cfg.features.enable_lora && plan.total_numel > 0) {
      train_passes = 2.0 + static_cast<double>(plan.trained_numel) / plan.total_numel;
      in.gemm_flops_per_sample *= train_passes / 3.0;
    }
    // dpo: a sample is two sequences, each also run forward once more, without grads, by the
    // reference (attention's backward counted as 2.5 forwards).
    if (cfg.training.objective == "dpo") {  // (a grpo prompt of num_generations 2 is no pair)
      in.gemm_flops_per_sample *= 2.0 * (train_passes + 1.0) / train_passes;
      in.attention_flops_per_sample *= 2.0 * (3.5 + 1.0) / 3.5;
    }
    // grpo: a sample is a prompt trained as its num_generations completions; once per rollout
    // (every num_iterations steps) each also runs forward without grads for the old policy's
    // log-probs (num_iterations > 1) and the reference's (beta != 0). The rollout's generation is
    // priced apart, as its phase (plan_rollout).
    if (cfg.training.objective == "grpo") {
      const auto& g = cfg.training.grpo;
      const double forwards = ((g.num_iterations > 1 ? 1.0 : 0.0) + (g.beta != 0.0 ? 1.0 : 0.0)) /
                              static_cast<double>(g.num_iterations);
      const double completions = static_cast<double>(sequences_per_sample);
      in.gemm_flops_per_sample *= completions * (train_passes + forwards) / train_passes;
      in.attention_flops_per_sample *= completions * (3.5 + forwards) / 3.5;
    }
  }
  if (act.num_layers > 0) {
    in.tokens_per_rank = act.tokens;
    in.q_width = act.q_width;
    in.kv_width = act.kv_width;
    in.num_layers = act.num_layers;
    // Activation offload sends n - 1 of the n layers' kept tensors (plan/offload_plan.h).
    const int64_t kept = recompute ? act.layer_inputs_bytes : act.layers_full_bytes;
    in.offloaded_activation_bytes = kept / act.num_layers * std::max<int64_t>(0, act.num_layers - 1);
  }
  return in;
}

}  // namespace mmtrain
