// Held-out evaluation while training (training.eval_interval, eval_iters, eval_at_start,
// eval_batch_size, eval_timesteps; data.validation or data.validation_split).
//
// Every evaluation reads the same samples in the same micro-batches (the held-out set in order,
// global batch g of eval_batch_size x dp samples, rank r its b consecutive ones), so the curve
// compares like with like. Forward only: under no-grad, FSDP gathers each unit for its forward
// and lets it go after; no autograd graph and no activations are kept.
//
// The loss is normalized over the whole evaluation, not averaged over micro-batches: each loss
// term's sum over every sample on every rank, divided by its count over the same (the batch's
// loss_normalizer set to 1 makes the model return sums; Model::loss_counts the counts), summed over
// the data-parallel ranks (a context-parallel group holds one micro-batch: counted once).
//   language model:  eval_loss = Σ CE / supervised tokens, eval_ppl = exp(min(20, eval_loss))
//   diffusion model: each sample at K fixed timesteps, the quantiles eval_timesteps of the training
//                    distribution (Collator::timestep_quantile), noise from (seed, sample, timestep
//                    index) alone; eval_loss_t<q> = Σ_terms term mean at that timestep,
//                    eval_loss = their mean over timesteps, eval_loss_<term> each term's mean.
//   preference objective (training.objective dpo): eval_loss = the objective's loss over the held-out
//                    pairs (each micro-batch's weighted by its pairs), eval_rewards/... its metrics.
// The training RNG, data order and loader are untouched: a run with evaluation trains bitwise
// like one without.
#pragma once
#include "data/dataset.h"
#include "record/eval_record.h"
#include "train/run.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

class Evaluator {
 public:
  // Builds the validation set and checks the evaluation's keys against it (an empty set,
  // eval_iters past it). A training run (record_held_out) writes <output_dir>/validation_indices.json
  // (rank 0) under validation_split. Collective over the run's ranks only through its evaluations.
  Evaluator(const Run& run, bool record_held_out);

  // Whether iteration (steps taken) is one the config evaluates after.
  bool due(int64_t iteration) const;
  // One evaluation at the run's current weights; every rank calls it.
  EvalRecord evaluate(Run& run, int64_t iteration);
  // Global batches of one evaluation, and the samples they read.
  int64_t global_batches() const { return global_batches_; }

 private:
  // Under a token budget: one sample per micro-batch, and the validation samples over the budget
  // refused or left out (over_budget_samples).
  void keep_within_budget(const Run& run, int64_t budget);
  // This rank's samples of global batch g; a rank past the end of the set gets sample 0 and
  // `padding` (it still runs a forward: FSDP's gathers are collective; its sums are left out).
  std::vector<int64_t> rank_samples(int64_t g, int dp_rank, int dp, bool& padding) const;
  // training.objective dpo: the objective's loss and metrics over the held-out pairs
  // (train/objective.h), each micro-batch's loss weighted by its pairs.
  EvalRecord evaluate_objective(Run& run, int64_t iteration);

  const Config* config_ = nullptr;
  std::shared_ptr<Dataset> dataset_;
  std::shared_ptr<Collator> collator_;
  int64_t micro_ = 1;            // samples per rank per micro-batch
  int64_t global_batches_ = 0;   // per evaluation
  std::vector<double> quantiles_, sigmas_;  // a diffusion collator's timesteps; empty: one pass
};

// The evaluation sums of one process's micro-batches, before the reduction over ranks: per
// timestep slot j (one for a language model) and loss term k, the term's sum and its count.
struct EvalSums {
  std::vector<std::vector<double>> sums, counts;  // [slot][term]
};
// EvalSums (reduced over ranks) -> the record's losses (the normalization above); exposed for tests.
void eval_losses(const EvalSums& reduced, const std::vector<double>& quantiles, const std::vector<double>& sigmas,
                 const std::vector<std::string>& term_names, EvalRecord& record);

}  // namespace mmtrain
