// training.keep_best: the checkpoints a run keeps for their held-out loss (train/evaluate.h).
//
// The list travels in each checkpoint's trainer_state.json as
//   "best_checkpoints": [{"iteration": N, "eval_loss": x}, ...]   lowest loss first
// (the best so far when that checkpoint was saved, itself included when it qualified), so a
// resume continues it and pruning reads it from the checkpoint `latest` names: keep_latest_k
// never removes one of them. Only a saved checkpoint enters it (an evaluation with no save
// after it, such as eval_at_start's, is recorded but never best). Rank 0 also writes it, with
// the directory names, to <save>/best.json after each commit and before anything is pruned, and
// a resume rewrites it from the checkpoints on disk, so it never names a removed one for long.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

inline constexpr const char* kBestCheckpointsKey = "best_checkpoints";

struct BestCheckpoint {
  int64_t iteration = 0;
  double eval_loss = 0;
};

// The list after an evaluation at `iteration` with `eval_loss`: the `keep` lowest losses (ties: the
// earlier iteration). A non-finite loss never enters it.
std::vector<BestCheckpoint> best_checkpoints_update(std::vector<BestCheckpoint> best, int64_t iteration,
                                                    double eval_loss, int keep);

nlohmann::json best_checkpoints_json(const std::vector<BestCheckpoint>& best);
// A trainer_state.json's list ([] when it has none); a malformed one is an error naming `where`.
std::vector<BestCheckpoint> best_checkpoints_of(const nlohmann::json& trainer_state, const std::string& where);

// The entries of best whose checkpoint is complete on disk under save_root (the others were
// never saved, or were removed by hand).
std::vector<BestCheckpoint> best_checkpoints_on_disk(const std::string& save_root, const std::vector<BestCheckpoint>& best);

// Rewrites <save_root>/best.json from the list the checkpoint `latest` names holds (those of it
// on disk) and returns their names (iter_N): what pruning keeps. Writes nothing and returns
// nothing when there is no `latest` or its checkpoint keeps no list (keep_best off).
std::vector<std::string> best_checkpoints_sync_index(const std::string& save_root);

// Removes best.json's temporary files (best.json.tmp-*) a killed write left in save_root; the
// caller holds the save root's lock, so no write of them is in flight.
void best_checkpoints_remove_stale_temps(const std::string& save_root);

// <save_root>/best.json: {"metric": "eval_loss", "checkpoints": [{"iteration", "dir", "eval_loss"}]},
// written to a temporary file and renamed (never through a link).
void best_checkpoints_write_index(const std::string& save_root, const std::vector<BestCheckpoint>& best);

}  // namespace mmtrain
