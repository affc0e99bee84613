// The save phase of a run: holding training.save for the run (rank 0's lock, taken while the run
// is built), saving a step's checkpoint (in place, or staged and written in the background with
// training.async_save), pruning with keep_latest_k, and settling background saves at step
// boundaries. The checkpoint's contents and protocol are train/state.h's and
// checkpoint/sharded_checkpoint.h's.
#pragma once
#include "train/run.h"

#include <cstdint>
#include <functional>

namespace mmtrain {

// Rank 0 holds training.save for the run (train/save_root_lock.h); when another run holds it,
// every rank stops here, before anything is written.
void lock_save_root(Run& run);

// Saves the checkpoint of `step` (steps taken). record_step(ms the save held training up) runs
// once, before the checkpoint can become `latest`: a resume from it starts after that step and
// never records it again. (An async save commits at a later step boundary.)
void save_checkpoint(Run& run, int64_t step, const std::function<void(double stall_ms)>& record_step);

// A background save that finished (or failed) since the last call is settled now: its directory
// and what keep_latest_k pruned are said, its error raised. No-op without training.async_save.
void settle_async_save(Run& run);
// Waits for the background save in flight, if any, and settles it (a run's end leaves none behind).
void finish_async_saves(Run& run);

}  // namespace mmtrain
