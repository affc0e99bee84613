// What `mmtrain plan` works out for one config on one world, shared by the printed plan
// (planning/plan.cpp), the search over configurations (planning/plan_auto.cpp) and the run's own
// prediction (plan/run_prediction.h): the FSDP memory
// plan, the activation estimate of the tokens each rank holds, the context-parallel buffers,
// the inputs of the offload tiers' rules and of the step-time model.
#pragma once
#include "config/config.h"
#include "fsdp/plan.h"
#include "models/activation_estimate.h"
#include "models/model_spec.h"
#include "parallel/parallel_dims.h"
#include "plan/offload_plan.h"
#include "plan/step_time.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct PlanEstimate {
  Config cfg;
  ParallelDims dims;
  const ModelSpec* spec = nullptr;
  FsdpMemoryPlan plan;
  bool recompute = false;
  int64_t seqlen = 0, micro = 1, tokens_per_rank = 0;
  std::vector<std::pair<int64_t, int64_t>> images;  // (H, W) of each image of one sample
  std::vector<int64_t> flops_seqlens;  // the samples the step time averages over; empty: {seqlen}
  ActivationEstimate act;
  std::string no_activations;     // why there is no activation estimate; "" when there is one
  int64_t cp_buffer_bytes = 0;    // one layer's context-parallel attention buffers
  // training.objective dpo: a sample is a pair, so a micro-batch of `micro` holds 2 x micro
  // sequences; under full fine-tuning the frozen reference copy's shards (param_dtype, this
  // rank's 1/fsdp) stay on the device all run (config_needs_reference_copy).
  int64_t sequences_per_sample = 1;
  // training.objective grpo: a sample is a prompt of seqlen tokens, trained as sequences_per_sample
  // (num_generations) completions of up to completion_tokens more (activations only: the step
  // time's FLOPs are the prompts').
  int64_t completion_tokens = 0;
  int64_t reference_copy_bytes = 0;
  // training.ema: one fp32 shadow per trained element, beside the shards (optim/ema.h).
  int64_t ema_bytes = 0;

  // What an evaluation (training.eval_interval) holds beyond the step: its forwards run under
  // no-grad between steps, when the step's activations are freed, and keep one layer's working
  // set at a time (the largest layer's tensors) plus what lies outside the layers, for
  // training.eval_batch_size samples per micro-batch (one under a token budget), nothing for
  // backward. Beyond the step only where that exceeds the step's own activations; zero without an
  // activation estimate. On the device tier (on CPU the device is the host).
  TierBytes evaluation_bytes() const;
  // Every phase around the step for `setting` (plan/offload_plan.h), with the evaluation above and
  // the sampling phase (plan/sampling_plan.h) filled in.
  PhaseBytes phase_bytes(const OffloadSetting& setting, bool device_is_host) const;
  // offload_tier_bytes' inputs (they point into this estimate: do not copy it after asking).
  OffloadPlanInputs offload_inputs() const;
  // The step-time model's inputs, without the FLOPs when the model has no formula (flops false).
  StepTimeInputs step_inputs(int devices_per_node, bool* flops) const;
};

// What a rank holds beside the model's own state, the same for the plan and the start-up
// pre-flight (plan/preflight.h), each 0 when the config keeps none:
//   training.ema's fp32 shadows (optim/ema.h): one value per trained element, beside the shards;
//   a full fine-tuning dpo run's frozen reference copy (train/preference_reference.h): its shards
//   on this rank, through the same Module tree the run builds.
int64_t ema_shadow_bytes(const Config& cfg, const FsdpMemoryPlan& plan);
// Per rank, what training.optimizer keeps: AdamW's 8 bytes per trained shard element (the fsdp
// plan's optimizer_bytes), or the 8-bit AdamW's codes, absmax and small params' fp32 moments.
int64_t optimizer_state_bytes(const Config& cfg, Module& model, const FsdpMemoryPlan& plan, int fsdp_size);
// What the optimizer state off the step's side keeps there (OffloadPlanInputs::window_bytes):
// adamw_swap's three chunk windows, sized for free_bytes (none: unbounded), or adamw8bit's two
// units of state on the disk tier.
int64_t offload_window_bytes(const Config& cfg, const FsdpMemoryPlan& plan, std::optional<int64_t> free_bytes);
// The EMA's three chunk windows when training.ema.offload moves its shadows to a tier (else 0).
int64_t ema_window_bytes(const Config& cfg, const FsdpMemoryPlan& plan, std::optional<int64_t> free_bytes);
int64_t reference_copy_bytes(const Config& cfg, int fsdp_size);

// The estimate for cfg on `world` ranks; seqlen 0 = the model's default; images: (H, W) in pixels
// of each image of one sample (its tokens are in seqlen), for a model with a vision tower;
// flops_seqlens: the lengths of a data set's samples (plan/length_mix.h), whose mean FLOPs time
// the step while seqlen (their longest) sizes the memory. model: built from cfg.model (shapes
// only), reused across estimates of one model.
std::unique_ptr<PlanEstimate> plan_estimate(const Config& cfg, int world, int64_t seqlen, Module& model,
                                            const std::vector<std::pair<int64_t, int64_t>>& images = {},
                                            const std::vector<int64_t>& flops_seqlens = {});

}  // namespace mmtrain
