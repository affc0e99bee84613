// training.async_save: a checkpoint written while training goes on, to the same format and with
// the same crash safety as checkpoint_save (sharded_checkpoint.h).
//
//   start()  collective, at a save step: rank 0 creates iter_N.tmp (step 1), then every rank copies
//            its shards into staging buffers, reused from save to save, and a background thread
//            checks the staged copy (an optional check, e.g. for NaN) and writes its rank file from
//            it (step 2: checksums, fsync, rename). Training goes on as soon as the copy is done.
//   poll()   collective, at every step boundary while a save is in flight, never blocking: the
//            ranks agree on how far the save got. Once every rank's file is written, a background
//            thread on rank 0 commits it (step 3: index.json, trainer_state.json, rename, `latest`)
//            and prunes to keep_latest_k. A failed write on any rank throws on every rank, naming
//            the failing rank and, on that rank, the file and errno; `latest` then still names the
//            previous complete checkpoint.
//   wait()   collective: blocks until the save in flight is complete.
// At most one save is in flight: start() refuses a second, the caller wait()s first.
// poll() and wait() must be called by all ranks alike (they all-reduce).
#pragma once
#include "checkpoint/sharded_checkpoint.h"
#include "dist/comm.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <future>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

class AsyncCheckpointSaver {
 public:
  explicit AsyncCheckpointSaver(Comm& comm) : comm_(comm) {}
  // Waits for a background thread still running (after an error elsewhere); never commits.
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  struct Staged {
    double ms = 0;      // this rank's copy into the staging buffers
    int64_t bytes = 0;  // this rank's staged bytes
  };
  // `tensors` may alias live training state, or fetch it (ShardedTensor::fetch, called once here):
  // it is copied before start() returns. check_staged
  // (optional) runs on the background thread on the staged copy before anything is written: what
  // it throws fails the save like a failed write.
  using StagedCheck = std::function<void(const std::vector<ShardedTensor>& staged)>;
  Staged start(const std::string& save_root, int64_t iteration, const std::vector<ShardedTensor>& tensors,
               nlohmann::json global_state, nlohmann::json rank_state, nlohmann::json plan, int keep_latest_k,
               StagedCheck check_staged = {});

  struct Completed {
    std::string dir;                  // the committed iter_N directory
    CheckpointPruned pruned;  // keep_latest_k's removals and warnings (rank 0 only; empty elsewhere)
  };
  // The save just completed, or nothing (none in flight, or still being written).
  std::optional<Completed> poll() { return advance(false); }
  // Blocks until the save in flight is committed; nothing when none was in flight.
  std::optional<Completed> wait() { return advance(true); }
  bool in_flight() const { return phase_ != Phase::idle; }

 private:
  enum class Phase { idle, writing, committing };
  std::optional<Completed> advance(bool block);
  // Every rank's outcome of its current background job (0 running, 1 done, 2 failed): throws on
  // every rank when one failed.
  std::vector<double> agree(std::future<void>* job, bool block, const char* what);

  Comm& comm_;
  Phase phase_ = Phase::idle;
  std::string save_root_, name_;
  int64_t iteration_ = 0;
  nlohmann::json global_state_, plan_;
  int keep_latest_k_ = 0;
  std::vector<at::Tensor> staging_;  // one per tensor of the last start(), reused while shapes match
  std::future<void> write_;          // step 2 on this rank
  std::future<void> commit_;         // step 3 and pruning, rank 0
  std::string job_error_;            // this rank's failed job's message
  CheckpointPruned pruned_;          // written by commit_, read after it is done
};

}  // namespace mmtrain
