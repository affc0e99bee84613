#include "plan/sampling_plan.h"

#include "core/checked_math.h"
#include "core/error.h"
#include "core/text.h"
#include "plan/device_profile.h"
#include "plan/plan_estimate.h"
#include "plan/step_time.h"

#include <algorithm>

namespace mmtrain {

Registry<SamplingWorkFn>& sampling_work_registry() {
  static Registry<SamplingWorkFn> registry("sampler");
  return registry;
}

namespace {

// The forward share of the formula's forward + backward FLOPs at `seqlen` (plan/step_time.h's
// recompute rule): GEMMs a third, attention 2 of its 7 parts.
struct ForwardFlops {
  double gemm = 0, attention = 0;
};
ForwardFlops forward_flops(const PlanEstimate& e, int64_t seqlen, const std::vector<std::pair<int64_t, int64_t>>& images) {
  FlopsQuery query;
  query.seqlens = {seqlen};
  query.images = images;
  const FlopsReport report = e.spec->flops(e.cfg.model.config, query);
  return {(report.flops_per_sample - report.attention_flops_per_sample) / 3.0,
          report.attention_flops_per_sample * 2.0 / 7.0};
}

// The memory and (with a profile) the time of `work`'s forwards on one rank.
SamplingPlan price_work(const PlanEstimate& e, SamplingWork work, const DeviceProfile* profile, int devices_per_node) {
  SamplingPlan out;
  out.work = std::move(work);
  const int cp = e.dims.cp();
  const std::string what = "plan: the sampling phase";
  for (const auto& f : out.work.forwards) {
    checked_tokens(f.tokens, what + "'s tokens");
    out.forwards = checked_add(out.forwards, f.count, what);
    if (f.cached || !e.no_activations.empty()) continue;
    const int64_t local = (f.tokens + cp - 1) / cp;
    const ActivationEstimate act =
        e.spec->activations(ActivationQuery{e.cfg.model.config, local, 1, e.plan.config.param_dtype, cp == 1 ? f.images
                                                                                                              : std::vector<std::pair<int64_t, int64_t>>{}});
    out.forward_bytes = std::max(out.forward_bytes, act.forward_only_bytes());
  }
  out.forward_bytes = checked_add(out.forward_bytes, out.work.held_device_bytes, what);
  const int64_t step = e.no_activations.empty() ? (e.recompute ? e.act.with_recompute_bytes() : e.act.without_recompute_bytes()) : 0;
  out.beyond_step.device = std::max<int64_t>(0, out.forward_bytes - step);

  if (!profile || !e.spec->flops) return out;
  bool unused = false;
  StepTimeInputs in = e.step_inputs(devices_per_node, &unused);
  in.forward_only = true;
  in.micro_batch_size = 1;
  in.accumulation = 1;
  in.recompute = false;
  double total_ms = 0;
  for (const auto& f : out.work.forwards) {
    ForwardFlops flops;
    if (f.cached) {  // one token's GEMMs; its attention over n cached tokens, 2 / n of a causal n-token forward's
      flops.gemm = forward_flops(e, 1, {}).gemm;
      flops.attention = forward_flops(e, f.tokens, {}).attention * 2.0 / static_cast<double>(f.tokens);
    } else {
      flops = forward_flops(e, f.tokens, f.images);
    }
    in.gemm_flops_per_sample = flops.gemm;
    in.attention_flops_per_sample = flops.attention;
    in.tokens_per_rank = f.cached ? 1 : (f.tokens + cp - 1) / cp;
    total_ms += static_cast<double>(f.count) * predict_step_time(in, *profile, e.plan.config.param_dtype).total_ms;
  }
  out.time_ms = total_ms;
  return out;
}

}  // namespace

std::optional<SamplingPlan> plan_sampling(const PlanEstimate& e, const DeviceProfile* profile, int devices_per_node) {
  const auto& t = e.cfg.training;
  if (t.sample_interval <= 0 && !t.sample_at_start) return std::nullopt;
  const auto& id = e.cfg.model.model_id;
  return price_work(e, sampling_work_registry().get(id, "plan: training.sample_prompts of model '" + id + "'")(e.cfg, e.dims),
                    profile, devices_per_node);
}

std::optional<SamplingPlan> plan_rollout(const PlanEstimate& e, const DeviceProfile* profile, int devices_per_node) {
  const auto& t = e.cfg.training;
  if (t.objective != "grpo" || !e.no_activations.empty()) return std::nullopt;
  const std::string what = "plan: the GRPO rollout";
  const int64_t prompts = checked_mul(e.micro, config_accumulation(e.cfg, e.dims), what);
  const int64_t completions = checked_mul(prompts, t.grpo.num_generations, what);
  const int64_t prompt = e.seqlen, new_tokens = t.grpo.max_completion_length;
  SamplingWork work;
  work.forwards.push_back({prompts, prompt, false, e.images});  // one prefill a prompt, shared by its G
  // The decode steps attend over prompt + 1 .. prompt + new_tokens - 1: priced at the middle, a
  // token each (a prompt's G run in one call; their FLOPs add up alike).
  if (new_tokens > 1) work.forwards.push_back({checked_mul(completions, new_tokens - 1, what), prompt + new_tokens / 2, true, {}});
  const int64_t element = static_cast<int64_t>(c10::elementSize(e.plan.config.param_dtype));
  work.held_device_bytes = checked_mul(checked_mul(checked_mul(2 * e.act.num_layers, e.act.kv_width, what),
                                                   checked_mul(prompt + new_tokens, element, what), what),
                                       t.grpo.num_generations, what + ": the KV cache");
  const int64_t kv_cache = work.held_device_bytes;
  // gather_for_generation: every unit stays gathered all rollout, beside its shards.
  if (t.grpo.gather_for_generation)
    work.held_device_bytes = checked_add(work.held_device_bytes, e.plan.unsharded_param_bytes, what);
  work.summary = format("%lld completions a step (%lld prompts x num_generations %lld) of up to %lld new tokens after "
                        "prompts of %lld tokens (KV cache %.2f MiB%s)",
                        static_cast<long long>(completions), static_cast<long long>(prompts),
                        static_cast<long long>(t.grpo.num_generations), static_cast<long long>(new_tokens),
                        static_cast<long long>(prompt), static_cast<double>(kv_cache) / (1024.0 * 1024.0),
                        t.grpo.gather_for_generation ? ", and the whole model gathered: gather_for_generation" : "");
  return price_work(e, std::move(work), profile, devices_per_node);
}

}  // namespace mmtrain
