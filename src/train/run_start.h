// The start phase of a run: where it begins. training.load (auto resolved against training.save),
// a resume from a checkpoint (weights, optimizer, RNG, the step and the lineage of checkpoints) or
// the initial weights; and the refusals that keep one output directory and one save root to one
// run: an earlier run's metrics.jsonl, a finished run, checkpoints of another branch. The sequence
// is start_run's; each of its decisions is a named piece in run_start.cpp.
#pragma once
#include "train/run.h"

#include <memory>

namespace mmtrain {

// The whole start: build the run (train/run.h), then resume from `load` or load the initial
// weights, claim the save root and continue (or begin) metrics.jsonl. Returns the built run.
std::unique_ptr<Run> start_run(Config config, Runtime runtime);

}  // namespace mmtrain
