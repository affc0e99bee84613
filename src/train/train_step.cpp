#include "train/train_step.h"

#include "core/error.h"
#include "core/finite.h"

#include <ATen/record_function.h>

#include <cmath>
#include <optional>
#include <utility>

namespace mmtrain {
namespace {

// One phase: a profiler scope (when a profiler is on) and the listener's begin/end around it.
class PhaseScope {
 public:
  PhaseScope(const StepPhaseListeners& listeners, StepPhase phase)
      : listeners_(listeners), phase_(phase), record_(at::RecordScope::USER_SCOPE) {
    if (record_.isActive()) record_.before(std::string("mmtrain::") + step_phase_name(phase));
    for (auto* listener : listeners_) listener->phase_begins(phase_);
  }
  ~PhaseScope() {
    for (auto* listener : listeners_) listener->phase_ends(phase_);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  const StepPhaseListeners& listeners_;
  StepPhase phase_;
  at::RecordFunction record_;
};

}  // namespace

const char* step_phase_name(StepPhase phase) {
  switch (phase) {
    case StepPhase::data: return "data";
    case StepPhase::forward: return "forward";
    case StepPhase::backward: return "backward";
    case StepPhase::clip: return "clip";
    case StepPhase::optimizer: return "optimizer";
  }
  return "?";
}

void PhaseTimer::phase_begins(StepPhase phase) {
  began_[static_cast<size_t>(phase)] = std::chrono::steady_clock::now();
}

void PhaseTimer::phase_ends(StepPhase phase) {
  const auto i = static_cast<size_t>(phase);
  ms_[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began_[i]).count();
}

std::array<double, kStepPhases> PhaseTimer::take_ms() { return std::exchange(ms_, {}); }

ModelOutput forward_backward(Model& model, Fsdp& fsdp, const Batch& batch, double loss_divisor,
                             const StepPhaseListeners& listeners) {
  ModelOutput out;
  {
    PhaseScope scope(listeners, StepPhase::forward);
    fsdp.begin_forward();
    out = model.forward(batch);
  }
  PhaseScope scope(listeners, StepPhase::backward);
  (loss_divisor == 1.0 ? out.loss : out.loss / loss_divisor).backward();
  fsdp.finish_backward();
  return out;
}

namespace {

// Which weight or AdamW moment of this rank's shards holds NaN/Inf, as "the weights of 'name'
// (element i of this rank's shard)"; empty when all are finite. adamw's params are the units'
// shard_flat, in unit order (make_fsdp_adamw).
std::string describe_shard_element(const FsdpUnit& unit, const std::string& what, int64_t at) {
  for (const auto& p : unit.params)
    if (at >= p.offset && at < p.offset + p.layout.shard_numel())
      return what + " of '" + p.name + "' (element " + std::to_string(at - p.offset) + " of this rank's shard)";
  return what + " of FSDP unit '" + unit.name + "' (padding element " + std::to_string(at) + ")";
}

std::string non_finite_state(Fsdp& fsdp, const AdamW& adamw) {
  const auto units = fsdp.units();
  for (const auto* unit : units)  // shards paged out to disk were checked by the step, chunk by chunk
    if (fsdp.shard_resident(*unit))
      if (const int64_t at = first_non_finite(unit->shard_flat); at >= 0)
        return describe_shard_element(*unit, "the weights", at);
  if (const auto bad = adamw.first_non_finite_moment(); bad && bad->param < units.size())
    return describe_shard_element(*units[bad->param], bad->moment == "weights" ? "the weights" : "the AdamW " + bad->moment,
                                  bad->element);
  return {};
}

}  // namespace

StepStats train_step(Model& model, Fsdp& fsdp, AdamW& adamw, const StepSettings& settings,
                     const std::function<Batch(int micro)>& micro_batch) {
  StepStats stats;
  fsdp.zero_grad();
  for (int m = 0; m < settings.accumulation; ++m) {
    Batch batch;
    {
      PhaseScope scope(settings.listeners, StepPhase::data);
      batch = micro_batch(m);
    }
    const auto out = forward_backward(model, fsdp, batch, settings.accumulation, settings.listeners);
    stats.loss_sum += out.loss.item<double>();
    stats.flops += model.train_flops(batch);
    stats.tokens += static_cast<double>(out.tokens);
  }
  {
    PhaseScope scope(settings.listeners, StepPhase::clip);
    stats.grad_norm = fsdp.clip_grad_norm(settings.clip_grad);
  }
  const auto reading = [&] { return settings.samples ? ", reading " + settings.samples() : std::string(); };
  if (!std::isfinite(stats.grad_norm))
    fail("iteration ", settings.iteration, ": grad norm is ", stats.grad_norm, " (NaN/Inf)", reading(),
         ": stopping before the step (a sample whose values overflow fp32, or a learning rate too large)");
  PhaseScope scope(settings.listeners, StepPhase::optimizer);
  adamw.step(settings.lr);
  const std::string bad = non_finite_state(fsdp, adamw);
  const bool any_bad = settings.world ? settings.world->any_rank(!bad.empty()) : !bad.empty();
  if (any_bad) {
    const std::string what = bad.empty() ? "a weight or moment on another rank (see its error)"
                                         : bad + (settings.world ? " on rank " + std::to_string(settings.world->rank()) : "");
    fail("iteration ", settings.iteration, ": the AdamW step at lr ", settings.lr, " (grad norm ", stats.grad_norm,
         ") made ", what, " NaN/Inf", reading(),
         ": stopping before anything is saved (the last checkpoint holds the last good state; lower training.lr or ",
         "training.weight_decay, or check those samples)");
  }
  return stats;
}

}  // namespace mmtrain
