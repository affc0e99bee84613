#include "checkpoint/best_checkpoints.h"

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "io/user_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

namespace mmtrain {

namespace fs = std::filesystem;

std::vector<BestCheckpoint> best_checkpoints_update(std::vector<BestCheckpoint> best, int64_t iteration,
                                                    double eval_loss, int keep) {
  if (!std::isfinite(eval_loss) || keep <= 0) return best;
  best.erase(std::remove_if(best.begin(), best.end(), [&](const BestCheckpoint& b) { return b.iteration == iteration; }),
             best.end());
  best.push_back({iteration, eval_loss});
  std::stable_sort(best.begin(), best.end(), [](const BestCheckpoint& a, const BestCheckpoint& b) {
    return a.eval_loss != b.eval_loss ? a.eval_loss < b.eval_loss : a.iteration < b.iteration;
  });
  if (best.size() > static_cast<size_t>(keep)) best.resize(keep);
  return best;
}

nlohmann::json best_checkpoints_json(const std::vector<BestCheckpoint>& best) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& b : best) list.push_back({{"iteration", b.iteration}, {"eval_loss", b.eval_loss}});
  return list;
}

std::vector<BestCheckpoint> best_checkpoints_of(const nlohmann::json& trainer_state, const std::string& where) {
  std::vector<BestCheckpoint> best;
  const auto it = trainer_state.find(kBestCheckpointsKey);
  if (it == trainer_state.end()) return best;
  if (!it->is_array()) fail(where, ": ", kBestCheckpointsKey, " is not a list");
  for (const auto& entry : *it) {
    const auto iteration = entry.is_object() ? entry.find("iteration") : entry.end();
    const auto loss = entry.is_object() ? entry.find("eval_loss") : entry.end();
    if (!entry.is_object() || iteration == entry.end() || !iteration->is_number_integer() || *iteration < 0 ||
        loss == entry.end() || !loss->is_number() || !std::isfinite(loss->get<double>()))
      fail(where, ": ", kBestCheckpointsKey, " entry ", entry.dump(),
           " is not {\"iteration\": N >= 0, \"eval_loss\": a finite number}");
    best.push_back({iteration->get<int64_t>(), loss->get<double>()});
  }
  return best;
}

std::vector<BestCheckpoint> best_checkpoints_on_disk(const std::string& save_root, const std::vector<BestCheckpoint>& best) {
  std::vector<BestCheckpoint> kept;
  for (const auto& b : best)
    if (fs::is_regular_file(fs::symlink_status(fs::path(save_root) / checkpoint_dir_name(b.iteration) / "index.json")))
      kept.push_back(b);
  return kept;
}

std::vector<std::string> best_checkpoints_sync_index(const std::string& save_root) {
  const fs::path root(save_root);
  std::vector<std::string> names;
  if (!fs::exists(root / "latest")) return names;
  const fs::path state = root / trim(file_read_text((root / "latest").string())) / "trainer_state.json";
  if (!fs::is_regular_file(state)) return names;
  const auto trainer_state = json_parse_checked(read_user_file(state.string(), state.string(), kMaxSmallJsonBytes), state.string());
  if (!trainer_state.is_object() || !trainer_state.contains(kBestCheckpointsKey)) return names;
  const auto best = best_checkpoints_on_disk(save_root, best_checkpoints_of(trainer_state, state.string()));
  best_checkpoints_write_index(save_root, best);
  for (const auto& b : best) names.push_back(checkpoint_dir_name(b.iteration));
  return names;
}

void best_checkpoints_remove_stale_temps(const std::string& save_root) {
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(save_root, error))
    if (entry.path().filename().string().rfind("best.json.tmp-", 0) == 0) fs::remove(entry.path(), error);
}

void best_checkpoints_write_index(const std::string& save_root, const std::vector<BestCheckpoint>& best) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& b : best)
    list.push_back({{"iteration", b.iteration}, {"dir", checkpoint_dir_name(b.iteration)}, {"eval_loss", b.eval_loss}});
  const std::string path = (fs::path(save_root) / "best.json").string();
  write_file_no_follow(path, nlohmann::json({{"metric", "eval_loss"}, {"checkpoints", list}}).dump(2) + "\n", path);
}

}  // namespace mmtrain
