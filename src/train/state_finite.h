// The one owner of "is this rank's training state finite": the fp32 weight shards and the AdamW
// moments, which a diverged step must never carry into a checkpoint (it would pass its checksums,
// and `latest` would name it).
//
// What a step costs: one pass over this rank's updated weights, and no collective of its own.
//   - gradients: a NaN/Inf anywhere makes the grad norm NaN/Inf; the norm is all-reduced anyway
//     (Fsdp::clip_grad_norm), and train_step stops before the optimizer step when it is not finite;
//   - moments need no pass: AdamW's m = b1 m + (1 - b1) g and v = b2 v + (1 - b2) g² stay finite
//     while every g is (a finite norm bounds each |g| below sqrt(FLT_MAX), so g² is finite too)
//     and they start finite (zeros, or a checkpoint whose save checked them);
//   - weights: the update can still overflow one (a decay outside its configured range, a weight
//     near FLT_MAX): after_step reads the resident shards once (shards on disk were read by AdamW
//     chunk by chunk while they were in RAM). What it finds rides on the next step's grad-norm
//     all-reduce (this rank adds NaN to its sum of squares), so every rank stops at the next step,
//     the rank that holds it naming the weight, the step, lr and samples; a save in between checks
//     every tensor it writes (describe_non_finite), and the trainer asks once more at the end.
#pragma once
#include "checkpoint/sharded_checkpoint.h"
#include "fsdp/fully_shard.h"
#include "optim/optimizer.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mmtrain {

class StateFiniteness {
 public:
  // After the optimizer step of `iteration`: one pass over the resident weight shards, plus what
  // AdamW saw of the shards it paged. samples (may be null): which samples the step read, asked
  // only when something is found.
  void after_step(Fsdp& fsdp, const Optimizer& optimizer, int64_t iteration, double lr, double grad_norm,
                  const std::function<std::string()>& samples);
  // Whether a step made one of this rank's weights NaN/Inf: the next grad norm is then NaN/Inf.
  bool non_finite() const { return !found_.empty(); }
  // "iteration 4: the AdamW step at lr 10 (grad norm 0.5) made the weights of 'w' (element 3 of
  // this rank's shard) NaN/Inf, reading ..."; empty when every weight is finite.
  const std::string& found() const { return found_; }

 private:
  std::string found_;
};

// The first NaN/Inf among tensors[0, count) (a checkpoint's weights and moments, the live ones or
// an asynchronous save's staged copy), described with the tensor's name, value and element of
// `rank`'s rows; empty when all are finite.
std::string describe_non_finite(const std::vector<ShardedTensor>& tensors, size_t count, int rank);

}  // namespace mmtrain
