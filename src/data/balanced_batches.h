// Token-budget micro-batches, balanced across data-parallel ranks: how one step's global batch
// (the same G samples whatever the split) becomes each rank's micro-batches when
// data.dataloader_param.micro_batch_tokens is set (issue 38; MindSpeed-MM's BucketBatchSampler with
// priority_mode, verl's sequence balancing).
//
// For the step's samples, each with its tokens and its predicted cost (the model's FLOPs of that one
// sample, attention's quadratic term included: the planner's rule), the split is
//   1. bins: first-fit decreasing by tokens into micro-batches of at most `budget` tokens (a sample
//      over the budget on its own is refused);
//   2. a bin count every rank can share: while K bins are not a multiple of the DP world, the bin
//      with the most samples (then the most tokens, then the first) is split in two, its samples
//      dealt alternately by decreasing tokens; G is a multiple of the world, so single-sample bins
//      always get there;
//   3. K / world bins per rank, bin i to rank i mod world (in the order step 1 made them).
// Balanced (balance_dp), the samples go to ranks first, by decreasing cost each to the rank with the
// least so far (longest-processing-time), each rank packs its own into bins (step 1), and a rank
// with fewer bins than another splits its widest (step 2's rule) until all have the same count. When
// a rank holds fewer samples than that count, the bins of steps 1-2 go whole, by decreasing cost,
// each to the least-loaded rank with room.
// Ties break on the lowest index, so the result is a function of its inputs alone: every rank
// computes the same split without communicating.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mmtrain {

struct SampleLoad {
  int64_t tokens = 0;
  double cost = 0;  // predicted work (FLOPs), any unit the same for all samples
};

struct StepSplit {
  // micro_batches[r][m]: positions (0 .. G-1, into the step's samples) of rank r's micro-batch m;
  // every rank has the same number of micro-batches.
  std::vector<std::vector<std::vector<int64_t>>> micro_batches;
  std::vector<double> rank_cost;  // Σ cost of each rank's samples
  int64_t budget_tokens = 0;      // the budget the bins were packed under
  int64_t tokens = 0;             // Σ tokens of the step
  double max_sample_cost = 0;     // the heaviest sample: no split puts less on one rank
  std::vector<int64_t> skipped;   // positions over the budget, left out (skip_over_budget)

  int64_t micro_batches_per_rank() const;
  // max over mean of rank_cost (1 = perfect balance).
  double imbalance() const;
  // The best imbalance any split could reach: max(mean, heaviest sample) over mean.
  double balance_bound() const;
  // Σ tokens over (micro-batches x budget): how full the micro-batches are.
  double budget_fill() const;
};

// A sample whose tokens exceed the budget is skipped (listed in `skipped`) with skip_over_budget,
// else refused naming it (describe(position), or "sample <position> of the step") and both
// numbers. Throws when fewer samples than ranks remain, or when the remaining ones cannot make the
// same micro-batch count on every rank, naming the step as step_name says ("iteration 5 (stream
// positions 64-95)"; "the step" when empty).
StepSplit split_step(const std::vector<SampleLoad>& samples, int dp_world, int64_t budget_tokens, bool balance,
                     bool skip_over_budget = false, const std::function<std::string(int64_t)>& describe = {},
                     const std::string& step_name = "");

}  // namespace mmtrain
