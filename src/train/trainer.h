// The training loop: builds the model, FSDP engine, optimizer, data and checkpoints from one
// Config and runs train_iters optimizer steps (resuming where a checkpoint left off).
//
// One step: for each of gradient_accumulation_steps micro-batches, gather the root, forward,
// backward of loss / accum (units gather, reshard and reduce-scatter on their own), wait for
// the reductions; then clip by the global grad norm, AdamW on the fp32 shards, log, maybe save.
#pragma once
#include "train/config.h"
#include "dist/runtime.h"

#include <memory>

namespace mmtrain {

class Trainer {
 public:
  Trainer(Config config, Runtime runtime);
  ~Trainer();
  void run();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace mmtrain
