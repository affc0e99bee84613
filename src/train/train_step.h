// One training step, shared by the trainer, `debug step` and the multi-rank tests:
//   for each of `accumulation` micro-batches: gather the root unit, forward, backward of
//   loss / accumulation (units gather, reshard and reduce-scatter on their own), wait for the
//   reductions; then clip by the global grad norm and step AdamW on the fp32 shards.
// Token-budget steps (micro-batches of varying size) normalize globally instead: every loss term
// is divided by its count over the step's whole global batch (Model::loss_counts summed over this
// rank's micro-batches and all data-parallel ranks), so the gradient is that of the global batch
// however its samples were split; FSDP averages grads over the dp ranks, so each micro-batch's
// backward is of loss x dp.
#pragma once
#include "fsdp/fully_shard.h"
#include "models/model.h"
#include "optim/ema.h"
#include "optim/optimizer.h"
#include "record/step_phases.h"
#include "train/objective.h"
#include "train/state_finite.h"

#include <array>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace mmtrain {


// Wall milliseconds per phase, summed over a step's micro-batches.
class PhaseTimer : public StepPhaseListener {
 public:
  void phase_begins(StepPhase phase) override;
  void phase_ends(StepPhase phase) override;
  // Milliseconds per phase (indexed by StepPhase) since the last call; resets them.
  std::array<double, kStepPhases> take_ms();

 private:
  std::array<double, kStepPhases> ms_{};
  std::array<std::chrono::steady_clock::time_point, kStepPhases> began_{};
};

// One micro-batch's forward and backward of loss / loss_divisor; the grads land in the FSDP grad
// shards. Returns the model's output (its loss undivided). `objective` null: the model's own loss
// (training.objective sft); else the objective's forward (train/objective.h).
using StepPhaseListeners = std::vector<StepPhaseListener*>;
ModelOutput forward_backward(Model& model, Fsdp& fsdp, const Batch& batch, double loss_divisor = 1.0,
                             const StepPhaseListeners& listeners = {}, const MicroBatchForward& objective = nullptr);

struct StepStats {
  double loss_sum = 0;    // Σ over micro-batches of this rank's loss (global normalization: this
                          // rank's share of the step's loss)
  double flops = 0;       // Σ of the model's train_flops
  double max_micro_batch_flops = 0;  // the heaviest micro-batch's
  double tokens = 0;      // Σ of the tokens the model processed
  double grad_norm = 0;   // global, before clipping
  std::map<std::string, double> metric_sums;  // Σ of the objective's metric sums (train/objective.h)
};

struct StepSettings {
  int64_t iteration = 1;  // 1-based: the optimizer step this is
  int accumulation = 1;   // micro-batches; each loss is divided by it (unless normalized globally)
  double lr = 0;
  double clip_grad = 0;   // max global grad norm; <= 0 measures the norm without clipping
  StepPhaseListeners listeners;
  // Which samples the step read ("stream positions 96-127 (epoch 0): a.pt, ..."), called only
  // for a failure's message; null: not known.
  std::function<std::string()> samples;
  // Global normalization (token-budget steps): sums a vector over the data-parallel ranks (every
  // rank calls it once per step, before its first forward); dp is their number. Null: each loss
  // is its micro-batch's mean, divided by `accumulation`.
  std::function<std::vector<double>(const std::vector<double>&)> sum_over_dp;
  int dp = 1;
  MicroBatchForward objective;  // null: the model's own loss (training.objective sft)
  Ema* ema = nullptr;  // training.ema: updated after the optimizer step
};

// One optimizer step over micro_batch(0 .. accumulation-1). Fails, naming the iteration and the
// samples, on a NaN/Inf grad norm, before the optimizer can spread it into the weights. After the
// step, one pass over the weights (StateFiniteness::after_step); a weight it made NaN/Inf (a
// learning rate or decay too large for fp32) makes the next step's grad norm NaN on every rank,
// and that step fails, the rank holding it naming the tensor, the step, lr, grad norm and samples.
// finiteness is the run's record (train/state_finite.h), the same object for every step of a run.
StepStats train_step(Model& model, Fsdp& fsdp, Optimizer& optimizer, StateFiniteness& finiteness, const StepSettings& settings,
                     const std::function<Batch(int micro)>& micro_batch);

// Global normalization's first part: the step's micro-batches, each with the batch's
// loss_normalizer (models/model.h) set to the global counts. Fails when the model reports none.
std::vector<Batch> with_global_loss_normalizers(const Model& model, std::vector<Batch> batches,
                                                const StepSettings& settings);

}  // namespace mmtrain
