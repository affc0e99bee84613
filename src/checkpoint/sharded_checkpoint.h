// mmtrain's own checkpoint: <save_root>/iter_NNNNNNN/ holds one safetensors file per rank (that
// rank's dim-0 rows of every tensor), index.json (who holds which rows) and trainer_state.json;
// <save_root>/latest names the newest complete one. Saving is collective and crash-safe (tmp dir +
// rename); reading works at any world size by row ranges (resharding). Every shard's bytes carry a
// CRC-32C in index.json, checked the first time a read touches the shard: a damaged file is an
// error naming the file and the tensor, never silently different weights. Non-goals: sharding along
// any dim but 0, filesystems that are not shared by all ranks. docs/checkpoint_format.md
// describes the format for people and for Python.
#pragma once
#include "dist/comm.h"
#include "io/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace mmtrain {

struct ShardedTensor {
  std::string name;
  std::vector<int64_t> global_shape;  // full tensor shape
  int64_t row_begin = 0;              // this rank holds rows [row_begin, row_begin + local.size(0)) of dim 0
  at::Tensor local;                   // may have 0 rows (empty shard); 0-dim tensors: held whole by rank 0 only
                                      // (other ranks may pass them too: they are ignored there)
  // Instead of local (a streamed save, e.g. a conversion larger than memory): produces it on
  // demand, the same tensor every call; a synchronous save calls it twice (checksum, then write)
  // and holds one such tensor at a time.
  std::function<at::Tensor()> fetch;
};

// "iter_0000020" for 20.
std::string checkpoint_dir_name(int64_t iteration);
// Whether save_root has a `latest` file, i.e. a save there has completed at least once.
bool checkpoint_saved_under(const std::string& save_root);
// Lineage: the checkpoints one run and its resumes wrote form a line, named by the "lineage" string
// of their trainer_state.json (absent in checkpoints from before lineages: the lineage ""). A
// resumed run continues the lineage of the checkpoint it loaded; a fresh run starts a new one.

// The complete iter_N directories under save_root of an iteration above `iteration`, oldest first:
// what a run resuming from `iteration` would branch away from (train/trainer.cpp refuses them, or
// archives them when asked).
std::vector<std::string> checkpoint_newer_than(const std::string& save_root, int64_t iteration);
// Moves the named iter_N directories of save_root into save_root/<archive_name>/ (created; never
// deleted). Returns that directory.
std::string checkpoint_archive(const std::string& save_root, const std::vector<std::string>& names,
                               const std::string& archive_name);

// training.keep_latest_k: removes the complete iter_N directories under save_root of `lineage`
// beyond its newest `keep` (keep >= 1), never the one `latest` names nor those its
// trainer_state.json keeps for their held-out loss (checkpoint/best_checkpoints.h); another lineage's
// checkpoints and unfinished saves (*.tmp) are not touched. A directory is renamed to
// iter_N.tmp.pruned before it is removed, so a crash midway leaves a stale save that the next save
// clears, never a half-deleted checkpoint. Rank 0 calls it after a save commits. It never throws:
// the checkpoint is committed whatever pruning meets; what it could not do comes back as warnings
// naming the directory and the error.
struct CheckpointPruned {
  std::vector<std::string> removed;   // oldest first
  std::vector<std::string> warnings;
};
CheckpointPruned checkpoint_prune(const std::string& save_root, int keep, const std::string& lineage);

// The save's three steps. checkpoint_save runs them with barriers in between; the asynchronous
// saver (checkpoint/async_checkpoint.h) runs 2 and 3 on background threads.
// 1. Rank 0, before anyone writes: removes stale iter_*.tmp* dirs and latest.tmp, creates the
//    empty iter_N.tmp (a fixed name: concurrent saves into one save_root are not supported).
//    Returns its path.
std::string checkpoint_save_prepare(const std::string& save_root, int64_t iteration);
// 2. Every rank: writes rank_XXXXX.safetensors into iter_N.tmp (shards checked, CRC-32C of each,
//    fsynced, renamed into place).
void checkpoint_save_rank_file(const std::string& save_root, int64_t iteration, int rank, int world,
                               const std::vector<ShardedTensor>& tensors, const nlohmann::json& rank_state);
// 3. Rank 0, once every rank's file is written: checks the files against each other, writes
//    index.json and trainer_state.json, fsyncs, renames iter_N.tmp to iter_N (replacing an old
//    iter_N), then atomically rewrites `latest`. Returns the final directory.
std::string checkpoint_save_commit(const std::string& save_root, int64_t iteration, int world,
                                   const nlohmann::json& global_state, const nlohmann::json& plan);

// Collective: every rank calls it with its own shards (any subset of tensors, as long as the ranks'
// row ranges of each tensor tile [0, global_shape[0]) exactly; rank 0 checks that before committing).
// Protocol (docs/checkpoint_format.md): step 1; barrier; step 2; barrier; step 3; rank 0's outcome
// of step 3 reaches every rank through a collective (never re-read from the shared filesystem, where
// another node may see a stale `latest`).
// A failure on any rank makes every rank throw after the last barrier (no rank is left waiting).
// before_commit, when given, runs on every rank once every rank file is written and before step 3:
// what must be on disk before the checkpoint can become `latest` (the trainer's metrics record of
// the saved iteration, which a resume from it never writes again). Returns the final directory.
std::string checkpoint_save(const std::string& save_root, int64_t iteration, Comm& comm,
                            const std::vector<ShardedTensor>& tensors,
                            const nlohmann::json& global_state, const nlohmann::json& rank_state,
                            const nlohmann::json& plan, const std::function<void()>& before_commit = {});

class CheckpointReader {
 public:
  // path is either a save_root containing `latest` or an iter_N directory. Validates index.json and
  // that every rank file exists, opens, and holds the shards index.json lists. Never looks at
  // *.tmp directories.
  explicit CheckpointReader(const std::string& path);

  const std::string& dir() const { return dir_; }
  int64_t iteration() const { return iteration_; }
  int saved_world_size() const { return world_size_; }
  const nlohmann::json& global_state() const { return global_state_; }
  nlohmann::json rank_state(int rank) const;  // the rank_state the given rank saved
  std::string rank_file(int rank) const;       // the path of rank's file (for messages)
  const nlohmann::json& plan() const { return plan_; }

  // Tensor names in index.json order.
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  std::vector<int64_t> global_shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  // Rows [row_begin, row_end) of dim 0 of the global tensor, assembled from whichever rank files
  // hold them (this is resharding: any reader world size works). Errors for unknown name or
  // out-of-range rows, and for 0-dim tensors (use read_full).
  at::Tensor read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const;
  at::Tensor read_full(const std::string& name) const;

  // Reads every shard of every tensor and checks its checksum (`mmtrain ckpt verify`); fails at the
  // first mismatch. Shards of checkpoints written before checksums existed are counted unchecked.
  struct VerifyReport {
    int64_t shards_checked = 0, shards_without_checksum = 0, bytes = 0;
  };
  VerifyReport verify() const;

 private:
  struct Shard {
    int rank = 0;
    int64_t row_begin = 0, row_end = 0;  // rows of the global tensor this rank's file holds
    std::optional<uint32_t> crc32c;      // of the shard's bytes; absent in checkpoints from before checksums
    mutable bool verified = false;       // reads are sequential: no lock
  };
  struct TensorEntry {
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape;
    std::vector<Shard> shards;  // non-empty ones, sorted by row_begin; one {rank 0} for 0-dim tensors
  };
  const TensorEntry& entry(const std::string& name) const;
  static std::string shard_rows_text(const TensorEntry& entry, const Shard& shard);
  // The whole shard, its checksum checked (once per shard and reader).
  at::Tensor read_verified_shard(const std::string& name, const Shard& shard) const;

  std::string dir_;
  int64_t iteration_ = 0;
  int world_size_ = 0;
  nlohmann::json global_state_;
  nlohmann::json plan_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, TensorEntry> tensors_;
  std::vector<SafetensorsFile> files_;  // by rank
};

}  // namespace mmtrain
