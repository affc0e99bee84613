#include "train/train_step.h"

#include "core/error.h"

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
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


void PhaseTimer::phase_begins(StepPhase phase) {
  began_[static_cast<size_t>(phase)] = std::chrono::steady_clock::now();
}

void PhaseTimer::phase_ends(StepPhase phase) {
  const auto i = static_cast<size_t>(phase);
  ms_[i] += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began_[i]).count();
}

std::array<double, kStepPhases> PhaseTimer::take_ms() { return std::exchange(ms_, {}); }

ModelOutput forward_backward(Model& model, Fsdp& fsdp, const Batch& batch, double loss_divisor,
                             const StepPhaseListeners& listeners, const MicroBatchForward& objective) {
  ModelOutput out;
  {
    PhaseScope scope(listeners, StepPhase::forward);
    if (objective) {
      out = objective(model, fsdp, batch);
    } else {
      check_sft_batch(batch);
      fsdp.begin_forward();
      out = model.forward(batch);
    }
  }
  PhaseScope scope(listeners, StepPhase::backward);
  (loss_divisor == 1.0 ? out.loss : out.loss / loss_divisor).backward();
  fsdp.finish_backward();
  return out;
}

std::vector<Batch> with_global_loss_normalizers(const Model& model, std::vector<Batch> batches,
                                                const StepSettings& settings) {
  std::vector<double> counts;
  for (const auto& batch : batches) {
    // A preference micro-batch's loss is a mean over its pairs, so the global batch's is over all of them.
    const auto pairs = batch.find(kPreferencePairsKey);
    const auto mine = pairs != batch.end() ? std::vector<double>{static_cast<double>(pairs->second.item<int64_t>())}
                                           : model.loss_counts(batch);
    if (mine.empty())
      fail("token-budget micro-batches (data.dataloader_param.micro_batch_tokens) normalize the loss over the global ",
           "batch, and this model reports no loss counts (Model::loss_counts): use micro_batch_size");
    if (counts.empty()) counts.assign(mine.size(), 0.0);
    for (size_t k = 0; k < mine.size(); ++k) counts[k] += mine[k];
  }
  counts = settings.sum_over_dp(counts);
  const auto normalizers = at::tensor(counts, at::kDouble);
  for (auto& batch : batches) batch[kLossNormalizerKey] = normalizers;
  return batches;
}

StepStats train_step(Model& model, Fsdp& fsdp, Optimizer& optimizer, StateFiniteness& finiteness, const StepSettings& settings,
                     const std::function<Batch(int micro)>& micro_batch) {
  StepStats stats;
  fsdp.zero_grad();
  // Global normalization needs every micro-batch's counts before the first backward: the step's
  // micro-batches are loaded up front (their inputs, not their activations, held at once).
  const bool global = static_cast<bool>(settings.sum_over_dp);
  std::vector<Batch> loaded;
  if (global) {
    PhaseScope scope(settings.listeners, StepPhase::data);
    for (int m = 0; m < settings.accumulation; ++m) loaded.push_back(micro_batch(m));
    loaded = with_global_loss_normalizers(model, std::move(loaded), settings);
  }
  const double loss_divisor = global ? 1.0 / settings.dp : settings.accumulation;
  for (int m = 0; m < settings.accumulation; ++m) {
    Batch batch;
    if (global) {
      batch = std::move(loaded[static_cast<size_t>(m)]);
    } else {
      PhaseScope scope(settings.listeners, StepPhase::data);
      batch = micro_batch(m);
    }
    const auto out = forward_backward(model, fsdp, batch, loss_divisor, settings.listeners, settings.objective);
    stats.loss_sum += out.loss.item<double>();
    for (const auto& [key, value] : out.metrics) stats.metric_sums[key] += value;
    const double flops = model.train_flops(batch);
    stats.flops += flops;
    stats.max_micro_batch_flops = std::max(stats.max_micro_batch_flops, flops);
    stats.tokens += static_cast<double>(out.tokens);
  }
  {
    PhaseScope scope(settings.listeners, StepPhase::clip);
    stats.grad_norm = fsdp.clip_grad_norm(settings.clip_grad, finiteness.non_finite());
  }
  const auto reading = [&] { return settings.samples ? ", reading " + settings.samples() : std::string(); };
  if (finiteness.non_finite())
    fail(finiteness.found(), ": stopping before anything is saved (found by the grad-norm reduction of iteration ",
         settings.iteration, "; the last checkpoint holds the last good state; lower training.lr or ",
         "training.weight_decay, or check those samples)");
  if (!std::isfinite(stats.grad_norm))
    fail("iteration ", settings.iteration, ": grad norm is ", stats.grad_norm, " (NaN/Inf)", reading(),
         ": stopping before the step (a sample whose values overflow fp32, a learning rate too large, or a weight "
         "the previous step made NaN/Inf on another rank: see its error)");
  {
    PhaseScope scope(settings.listeners, StepPhase::optimizer);
    optimizer.step(settings.lr);
    if (settings.ema) settings.ema->after_step(settings.iteration);
  }
  PhaseScope scope(settings.listeners, StepPhase::finite_check);
  finiteness.after_step(fsdp, optimizer, settings.iteration, settings.lr, stats.grad_norm, settings.samples);
  return stats;
}

}  // namespace mmtrain
