// The training loop: builds a run from one Config and takes train_iters optimizer steps (resuming
// where a checkpoint left off). Its phases are named pieces, each in its own file:
//   start  train/run_start.h   build the run (train/run.h), resume or load the initial weights
//   step   train/step_report.h one optimizer step: micro-batches, forward, backward, clip, AdamW
//   record train/step_report.h the step's record, reduced over ranks, checked against the plan,
//                              written by record/metrics.h
//   save   train/run_save.h    the checkpoint of a step, in place or in the background
//   evaluate train/evaluate.h  the held-out loss, after the steps training.eval_interval names
// trainer.cpp is the loop that sequences them: when to log, save and stop.
#pragma once
#include "config/config.h"
#include "dist/runtime.h"

#include <memory>

namespace mmtrain {

struct Run;

class Trainer {
 public:
  Trainer(Config config, Runtime runtime);
  ~Trainer();
  void run();

 private:
  std::unique_ptr<Run> run_;
};

}  // namespace mmtrain
