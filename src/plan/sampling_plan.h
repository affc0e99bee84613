// The sampling phase in the plan (training.sample_interval / sample_at_start; `mmtrain sample`,
// docs/sampling.md): what one pass over training.sample_prompts costs a rank, in memory beside
// the step and in time. A model's sampler says which forwards it runs (registered by model_id from
// src/sample, which knows the models; plan/ names none); this file prices them with the model's
// own activation estimate and FLOPs formula and the step-time model's forward-only rules.
//
// Memory: a sampler's forwards run under no-grad between steps, as an evaluation's do, so a
// forward holds one layer's working set and what lies outside the layers for its tokens (on this
// rank: 1 / cp of them), plus what the sampler keeps on the device all phase (a KV cache). Beyond
// the step only where that exceeds the step's activations.
// Time: Σ over the forwards of the forward-only step time (plan/step_time.h) at their FLOPs:
// a whole forward is the formula's forward share (GEMMs 1/3, attention 2/7 of forward + backward);
// a cached decode step is one token's GEMMs and its attention over the cache, 2 / n of a causal
// n-token forward's attention, bounded below by reading the weights once.
#pragma once
#include "config/config.h"
#include "core/registry.h"
#include "parallel/parallel_dims.h"
#include "plan/offload_plan.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

struct PlanEstimate;
struct DeviceProfile;

// `count` forwards of one kind that a rank runs in a sampling phase.
struct SamplingForward {
  int64_t count = 0;
  int64_t tokens = 0;   // the sequence it attends over
  bool cached = false;  // a KV-cached decode step: one new token against `tokens` cached ones
  std::vector<std::pair<int64_t, int64_t>> images;  // (H, W) of a whole forward's images
};

struct SamplingWork {
  std::string summary;                    // "2 prompts: 64 forwards of 4,544 tokens", for the plan
  std::vector<SamplingForward> forwards;  // one rank's (ranks run equal counts)
  int64_t held_device_bytes = 0;          // kept on the device all phase beside a forward (KV cache)
};

// config's sampler over its training.sample_prompts, on a mesh of `dims`.
using SamplingWorkFn = std::function<SamplingWork(const Config& config, const ParallelDims& dims)>;
Registry<SamplingWorkFn>& sampling_work_registry();

struct SamplingPlan {
  SamplingWork work;
  int64_t forward_bytes = 0;  // the largest forward's working set + the held bytes, on the device
  TierBytes beyond_step;      // what the phase holds beyond the step's activations
  int64_t forwards = 0;
  std::optional<double> time_ms;  // with a device profile and the model's FLOPs formula
};

// The phase of e's config, or nullopt when it samples nothing (no training.sample_interval or
// sample_at_start). Fails naming the model when it samples but registered no sampler. profile:
// null for memory only.
std::optional<SamplingPlan> plan_sampling(const PlanEstimate& e, const DeviceProfile* profile, int devices_per_node);

// GRPO's rollout (training.objective grpo, rl/rollout.h), priced as a sampling phase: per step on
// this rank, micro-batches x micro_batch_size prompts, each one forward over the prompt (e's
// sequence length and images) and max_completion_length - 1 cached decode steps for each of its
// num_generations completions (generated together); the KV cache of one prompt's completions held,
// and with grpo.gather_for_generation the whole model gathered.
// nullopt under another objective or without an activation estimate (its layer count and KV width).
std::optional<SamplingPlan> plan_rollout(const PlanEstimate& e, const DeviceProfile* profile, int devices_per_node);

}  // namespace mmtrain
