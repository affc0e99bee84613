#include "checkpoint/sharded_checkpoint.h"

#include "checkpoint/best_checkpoints.h"

#include "core/crc32c.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/regular_file.h"
#include "core/text.h"
#include "io/atomic_file.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <tuple>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFormat = "mmtrain.sharded_checkpoint";
// Version 2 records a crc32c for every non-empty shard; version 1 (before checksums) may lack
// them, and such shards load unchecked. Both are read; 2 is written.
constexpr int kVersion = 2;
constexpr int kVersionBeforeChecksums = 1;
constexpr const char* kIndexFile = "index.json";
constexpr const char* kTrainerStateFile = "trainer_state.json";
constexpr const char* kLatestFile = "latest";
// Keys of each rank file's __metadata__ (all values are strings there: JSON text for the two
// mmtrain ones). "format": "pt" is what HF tools expect of a torch safetensors file.
constexpr const char* kRankStateKey = "rank_state";
constexpr const char* kShardsKey = "shards";
constexpr const char* kTmpSuffix = ".tmp";

std::string rank_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "rank_%05d.safetensors", rank);
  return buf;
}

bool all_digits(const std::string& s, size_t from) {
  return s.size() > from && std::all_of(s.begin() + from, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "iter_<digits>": a complete checkpoint's directory name.
bool is_checkpoint_dir_name(const std::string& s) { return s.rfind("iter_", 0) == 0 && all_digits(s, 5); }

// "iter_<digits>.tmp<anything>": an unfinished (or crashed, or replaced) save.
bool is_tmp_dir_name(const std::string& s) {
  auto dot = s.find(kTmpSuffix);
  return dot != std::string::npos && is_checkpoint_dir_name(s.substr(0, dot));
}

// Every rank's row ranges of one tensor must tile [0, rows) exactly. `ranges` are (begin, end, rank).
void check_tiling(std::vector<std::tuple<int64_t, int64_t, int>> ranges, int64_t rows, const std::string& where) {
  std::sort(ranges.begin(), ranges.end());
  int64_t cursor = 0;
  int previous_rank = -1;
  for (const auto& [begin, end, rank] : ranges) {
    if (begin == end) continue;  // an empty shard holds nothing
    if (begin < cursor)
      fail(where, ": rank ", rank, " holds rows [", begin, ", ", end, ") which overlap rank ", previous_rank,
           "'s rows (up to ", cursor, ")");
    if (begin > cursor) fail(where, ": no rank holds rows [", cursor, ", ", begin, ")");
    cursor = end;
    previous_rank = rank;
  }
  if (cursor != rows) fail(where, ": no rank holds rows [", cursor, ", ", rows, ")");
}

// index.json as people read it: one line per tensor (so `grep name index.json` shows all of it,
// and a model with thousands of tensors stays small), everything else indented.
std::string index_json_text(const nlohmann::ordered_json& index) {
  auto indented = [](const nlohmann::ordered_json& value) {
    std::string text = value.dump(2);
    std::string out;
    for (char c : text) out += c == '\n' ? std::string("\n  ") : std::string(1, c);  // JSON strings hold no raw \n
    return out;
  };
  std::string text = "{\n";
  size_t i = 0;
  for (const auto& [key, value] : index.items()) {
    text += "  " + nlohmann::ordered_json(key).dump() + ": ";
    if (key == "tensors" && !value.empty()) {
      text += "{\n";
      size_t j = 0;
      for (const auto& [name, tensor] : value.items())
        text += "    " + nlohmann::ordered_json(name).dump() + ": " + tensor.dump() + (++j < value.size() ? ",\n" : "\n");
      text += "  }";
    } else {
      text += key == "files" ? value.dump() : indented(value);
    }
    text += ++i < index.size() ? ",\n" : "\n";
  }
  return text + "}\n";
}

// Renames `from` onto `to`, replacing a directory already there. Where the kernel and filesystem
// allow it the two are exchanged atomically (`to` is never missing), leaving the old one at
// `from`; otherwise the old one is first moved to `from_old`. Returns where the old one now is
// ("" when there was none): the caller deletes it after `latest` is updated.
std::string dir_replace(const fs::path& from, const fs::path& to, const fs::path& from_old) {
  if (!fs::exists(to)) {
    fs::rename(from, to);
    return "";
  }
#ifdef RENAME_EXCHANGE
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) return from.string();
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
    fail("cannot exchange ", from.string(), " with ", to.string(), ": ", std::strerror(errno));
#endif
  fs::rename(to, from_old);
  fs::rename(from, to);
  return from_old.string();
}

// The iteration of an iter_N directory name; -1 when its digits do not fit 64 bits (not a
// directory mmtrain wrote).
int64_t iteration_of(const std::string& dir_name) {
  const std::string digits = dir_name.substr(5);
  if (digits.size() > 18) return -1;
  return std::stoll(digits);
}

// Rank 0, before anyone writes: a crashed save's iter_*.tmp* dirs and latest.tmp go away, and the
// fixed tmp dir of this save starts empty.
void save_prepare(const fs::path& root, const fs::path& tmp_dir) {
  fs::create_directories(root);
  std::vector<fs::path> stale;  // collected first: removing while iterating a directory is unspecified
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (is_tmp_dir_name(name) || name == std::string(kLatestFile) + kTmpSuffix) stale.push_back(entry.path());
  }
  for (const auto& path : stale) fs::remove_all(path);
  fs::create_directory(tmp_dir);
}

void save_rank_file(const fs::path& file, int64_t iteration, int rank, int world,
                    const std::vector<ShardedTensor>& tensors, const nlohmann::json& rank_state) {
  std::vector<SafetensorsSource> sources;
  nlohmann::ordered_json shards = nlohmann::ordered_json::object();
  for (const auto& entry : tensors) {
    const std::string where = "checkpoint_save iteration " + std::to_string(iteration) + " rank " +
                              std::to_string(rank) + ": tensor '" + entry.name + "'";
    ShardedTensor t = entry;
    if (!t.local.defined() && t.fetch) t.local = t.fetch();  // for its checksum; fetched again to write
    if (!t.local.defined()) fail(where, ": local tensor is undefined");
    if (t.local.dim() != static_cast<int64_t>(t.global_shape.size()))
      fail(where, ": local shard is ", t.local.dim(), "-dim but global_shape ", shape_str(t.global_shape), " is ",
           t.global_shape.size(), "-dim");
    if (t.global_shape.empty()) {
      if (rank != 0) continue;  // 0-dim tensors are held whole by rank 0
      if (t.row_begin != 0) fail(where, ": 0-dim tensor needs row_begin 0, found ", t.row_begin);
    } else {
      const int64_t rows = t.local.size(0);
      for (size_t d = 1; d < t.global_shape.size(); ++d)
        if (t.local.size(d) != t.global_shape[d])
          fail(where, ": local shard shape ", shape_str(t.local.sizes().vec()), " does not match global_shape ",
               shape_str(t.global_shape), " beyond dim 0");
      if (t.row_begin < 0 || t.row_begin + rows > t.global_shape[0])
        fail(where, ": rows [", t.row_begin, ", ", t.row_begin + rows, ") out of range: global_shape ",
             shape_str(t.global_shape), " has ", t.global_shape[0], " rows");
    }
    if (shards.contains(t.name)) fail(where, ": given twice");
    // The checksum of exactly the bytes safetensors_write stores (it writes contiguous CPU data).
    auto local = t.local.contiguous().cpu();
    const uint32_t crc = crc32c(local.data_ptr(), local.nbytes());
    shards[t.name] = {{"global_shape", t.global_shape}, {"row_begin", t.row_begin}, {"crc32c", crc32c_hex(crc)}};
    SafetensorsSource source{t.name, local.scalar_type(), local.sizes().vec(), nullptr};
    if (entry.local.defined()) {
      source.fetch = [local] { return local; };
    } else {
      source.fetch = [fetch = entry.fetch] { return fetch().contiguous().cpu(); };
    }
    sources.push_back(std::move(source));
  }
  nlohmann::ordered_json header = {
      {"iteration", iteration}, {"rank", rank}, {"world_size", world}, {"tensors", shards}};
  safetensors_write_streamed(file.string(), sources,
                    {{"format", "pt"}, {kShardsKey, header.dump()}, {kRankStateKey, rank_state.dump()}});
}

// Rank 0, after every rank wrote its file: check them against each other, write index.json and
// trainer_state.json, then publish the directory and `latest`.
void save_commit(const fs::path& root, const fs::path& tmp_dir, const std::string& name, int64_t iteration,
                 int world, const nlohmann::json& global_state, const nlohmann::json& plan) {
  const std::string where = "checkpoint_save " + tmp_dir.string();
  // Per tensor, in first-seen order (rank 0's tensors first). Kept in vectors, not looked up in an
  // ordered_json (linear search): thousands of tensors times hundreds of ranks must stay cheap.
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    nlohmann::ordered_json shards = nlohmann::ordered_json::array();
    std::vector<std::tuple<int64_t, int64_t, int>> ranges;  // (row_begin, row_end, rank)
  };
  std::vector<Entry> entries;
  std::unordered_map<std::string, size_t> position;  // name -> index in entries
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (int r = 0; r < world; ++r) {
    const std::string file_name = rank_file_name(r);
    files.push_back(file_name);
    if (!fs::exists(tmp_dir / file_name))
      fail(where, ": rank ", r, " did not write ", file_name, " (rank ", r, "'s error says why)");
    SafetensorsFile file((tmp_dir / file_name).string());
    auto meta = file.metadata().find(kShardsKey);
    if (meta == file.metadata().end()) fail(where, ": ", file_name, " has no '", kShardsKey, "' metadata");
    const auto header = json_parse_checked(meta->second, where + ": " + file_name + " '" + kShardsKey + "' metadata");
    if (header.at("rank") != r || header.at("world_size") != world || header.at("iteration") != iteration)
      fail(where, ": ", file_name, " was written by rank ", header.at("rank"), " of ", header.at("world_size"),
           " for iteration ", header.at("iteration"), ", expected rank ", r, " of ", world, " for iteration ",
           iteration);
    const auto& shard_infos = header.at("tensors");
    for (const auto& tensor_name : file.names()) {
      const auto& info = file.info(tensor_name);
      const auto& shard = shard_infos.at(tensor_name);
      const auto global_shape = shard.at("global_shape").get<std::vector<int64_t>>();
      const int64_t row_begin = shard.at("row_begin").get<int64_t>();
      const std::string dtype = safetensors_dtype_name(info.dtype);
      auto [it, inserted] = position.emplace(tensor_name, entries.size());
      if (inserted) entries.push_back({tensor_name, dtype, global_shape});
      auto& entry = entries[it->second];
      if (entry.dtype != dtype || entry.shape != global_shape)
        fail(where, ": tensor '", tensor_name, "': rank ", r, " saved ", dtype, " ", shape_str(global_shape),
             " but an earlier rank saved ", entry.dtype, " ", shape_str(entry.shape));
      nlohmann::ordered_json shard_entry = {{"rank", r}, {"file", file_name}};
      if (!global_shape.empty()) {
        const int64_t row_end = row_begin + info.shape[0];
        shard_entry["rows"] = {row_begin, row_end};
        entry.ranges.emplace_back(row_begin, row_end, r);
      }
      shard_entry["crc32c"] = shard.at("crc32c").get<std::string>();
      entry.shards.push_back(std::move(shard_entry));
    }
  }
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (auto& entry : entries) {
    if (!entry.shape.empty()) check_tiling(entry.ranges, entry.shape[0], where + ": tensor '" + entry.name + "'");
    // Names are unique here, so appending (no lookup) keeps this linear.
    tensors.get_ref<nlohmann::ordered_json::object_t&>().emplace_back(
        entry.name, nlohmann::ordered_json{{"dtype", entry.dtype}, {"shape", entry.shape}, {"shards", std::move(entry.shards)}});
  }
  nlohmann::ordered_json index_json = {{"format", kFormat},   {"version", kVersion}, {"iteration", iteration},
                                       {"world_size", world}, {"files", files},     {"tensors", tensors},
                                       {"plan", nlohmann::ordered_json::parse(plan.dump())}};
  file_write_atomic((tmp_dir / kIndexFile).string(), index_json_text(index_json));
  file_write_atomic((tmp_dir / kTrainerStateFile).string(), global_state.dump(2) + "\n");
  dir_fsync(tmp_dir.string());

  const fs::path final_dir = root / name;
  const std::string old = dir_replace(tmp_dir, final_dir, root / (name + kTmpSuffix + ".old"));
  dir_fsync(root.string());
  file_write_atomic((root / kLatestFile).string(), name + "\n");
  dir_fsync(root.string());
  if (!old.empty()) fs::remove_all(old);
}

}  // namespace

bool checkpoint_saved_under(const std::string& save_root) { return fs::exists(fs::path(save_root) / kLatestFile); }

std::string checkpoint_dir_name(int64_t iteration) {
  if (iteration < 0) fail("checkpoint iteration must be >= 0, found ", iteration);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

namespace {

// The complete iter_N directories under root, by iteration.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, std::string>> complete;
  if (!fs::is_directory(root)) return complete;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !is_checkpoint_dir_name(name) || !fs::exists(entry.path() / kIndexFile)) continue;
    if (const int64_t iteration = iteration_of(name); iteration >= 0) complete.emplace_back(iteration, name);
  }
  std::sort(complete.begin(), complete.end());
  return complete;
}

// The lineage a checkpoint directory's trainer_state.json records ("" when it records none);
// nullopt when the file cannot be read as JSON (not a checkpoint to touch).
std::optional<std::string> lineage_of(const fs::path& dir) {
  try {
    const auto state = nlohmann::json::parse(file_read_text((dir / kTrainerStateFile).string()));
    const auto it = state.find("lineage");
    if (it == state.end()) return std::string();
    return it->is_string() ? std::optional<std::string>(it->get<std::string>()) : std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::vector<std::string> checkpoint_newer_than(const std::string& save_root, int64_t iteration) {
  std::vector<std::string> newer;
  for (const auto& [it, name] : complete_checkpoints(save_root))
    if (it > iteration) newer.push_back(name);
  return newer;
}

std::string checkpoint_archive(const std::string& save_root, const std::vector<std::string>& names,
                               const std::string& archive_name) {
  const fs::path root(save_root), archive = root / archive_name;
  fs::create_directory(archive);
  for (const auto& name : names) {
    if (!is_checkpoint_dir_name(name)) fail("checkpoint_archive: '", name, "' is not an iter_N directory name");
    fs::rename(root / name, archive / name);
  }
  dir_fsync(archive.string());
  dir_fsync(root.string());
  return archive.string();
}

CheckpointPruned checkpoint_prune(const std::string& save_root, int keep, const std::string& lineage) {
  CheckpointPruned out;
  if (keep < 1) {
    out.warnings.push_back("training.keep_latest_k must be >= 1 to prune, found " + std::to_string(keep));
    return out;
  }
  const fs::path root(save_root);
  try {
    std::string latest;
    if (fs::exists(root / kLatestFile)) latest = trim(file_read_text((root / kLatestFile).string()));
    std::vector<std::string> ours;
    for (const auto& [iteration, name] : complete_checkpoints(root))
      if (lineage_of(root / name) == lineage) ours.push_back(name);
    // training.keep_best's checkpoints are kept for their held-out loss, whatever their age;
    // best.json names them before anything is removed.
    const auto best = best_checkpoints_sync_index(save_root);
    const size_t doomed = ours.size() > static_cast<size_t>(keep) ? ours.size() - keep : 0;
    for (size_t i = 0; i < doomed; ++i) {
      const std::string& name = ours[i];
      if (name == latest || std::find(best.begin(), best.end(), name) != best.end()) continue;
      const fs::path pruned = root / (name + kTmpSuffix + ".pruned");
      std::error_code error;
      fs::path failed = root / name;
      fs::rename(failed, pruned, error);
      if (!error) {
        failed = pruned;
        fs::remove_all(pruned, error);
      }
      if (error) {
        out.warnings.push_back("cannot remove " + failed.string() + ": " + error.message() + " (errno " +
                               std::to_string(error.value()) + ")");
        continue;
      }
      out.removed.push_back(name);
    }
  } catch (const std::exception& e) {
    out.warnings.push_back("cannot prune " + save_root + ": " + e.what());
  }
  return out;
}

std::string checkpoint_save_prepare(const std::string& save_root, int64_t iteration) {
  const fs::path root(save_root);
  const fs::path tmp_dir = root / (checkpoint_dir_name(iteration) + kTmpSuffix);
  save_prepare(root, tmp_dir);
  return tmp_dir.string();
}

void checkpoint_save_rank_file(const std::string& save_root, int64_t iteration, int rank, int world,
                               const std::vector<ShardedTensor>& tensors, const nlohmann::json& rank_state) {
  const fs::path tmp_dir = fs::path(save_root) / (checkpoint_dir_name(iteration) + kTmpSuffix);
  if (!fs::is_directory(tmp_dir))
    fail("checkpoint_save rank ", rank, ": ", tmp_dir.string(), " does not exist (rank 0 failed to create it)");
  save_rank_file(tmp_dir / rank_file_name(rank), iteration, rank, world, tensors, rank_state);
}

std::string checkpoint_save_commit(const std::string& save_root, int64_t iteration, int world,
                                   const nlohmann::json& global_state, const nlohmann::json& plan) {
  const fs::path root(save_root);
  const std::string name = checkpoint_dir_name(iteration);
  save_commit(root, root / (name + kTmpSuffix), name, iteration, world, global_state, plan);
  return (root / name).string();
}

std::string checkpoint_save(const std::string& save_root, int64_t iteration, Comm& comm,
                            const std::vector<ShardedTensor>& tensors, const nlohmann::json& global_state,
                            const nlohmann::json& rank_state, const nlohmann::json& plan,
                            const std::function<void()>& before_commit) {
  const int rank = comm.rank(), world = comm.world_size();
  const fs::path root(save_root);
  const std::string name = checkpoint_dir_name(iteration);  // throws on every rank alike
  const fs::path final_dir = root / name;

  // No rank may throw before the last barrier, or the others would wait there until the backend's
  // timeout: a failing step is remembered, later steps of that rank are skipped, and the failure
  // reaches the other ranks through the filesystem (a missing tmp dir, rank file or commit).
  std::exception_ptr error;
  auto step = [&](auto&& body) {
    if (error) return;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
  };

  if (rank == 0) step([&] { checkpoint_save_prepare(save_root, iteration); });
  comm.barrier();
  step([&] { checkpoint_save_rank_file(save_root, iteration, rank, world, tensors, rank_state); });
  comm.barrier();
  if (before_commit) step(before_commit);
  if (rank == 0) step([&] { checkpoint_save_commit(save_root, iteration, world, global_state, plan); });
  // Did rank 0 commit? Its word, not the filesystem's (another node may see a stale `latest`).
  const bool committed = !comm.any_rank(rank == 0 && error);
  if (!committed && rank != 0 && !error)
    step([&] { fail("checkpoint_save rank ", rank, ": rank 0 did not commit ", final_dir.string(), " (rank 0's error says why)"); });

  if (error) std::rethrow_exception(error);
  return final_dir.string();
}

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

// An index.json field that must fit an int (the world size, a rank): nlohmann's get<int>() would
// wrap 4294967297 to 1.
int index_int(const nlohmann::ordered_json& object, const char* key, const std::string& where) {
  const auto& v = object.at(key);
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT32_MAX)
                    : v.is_number_integer() ? v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX
                                            : false;
  if (!fits) fail(where, ": '", key, "' must be an integer of 32 bits, found ", v.dump());
  return static_cast<int>(v.get<int64_t>());
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path) {
  const fs::path p(path);
  if (!fs::exists(p)) fail("checkpoint ", path, ": no such file or directory");
  if (!fs::is_directory(p)) fail("checkpoint ", path, ": expected a directory");
  fs::path dir;
  if (fs::exists(p / kLatestFile)) {
    const std::string latest = trim(file_read_text((p / kLatestFile).string()));
    if (!is_checkpoint_dir_name(latest))
      fail("checkpoint ", (p / kLatestFile).string(), ": expected a directory name like iter_0000020, found '",
           latest, "'");
    dir = p / latest;
    if (!fs::is_directory(dir))
      fail("checkpoint ", (p / kLatestFile).string(), " points at ", latest, " but ", dir.string(),
           " does not exist");
  } else if (fs::exists(p / kIndexFile)) {
    dir = p;
  } else {
    fail("checkpoint ", path, ": expected a save_root holding `", kLatestFile, "` or an iter_N directory holding ",
         kIndexFile, ", found neither");
  }
  fs::path normal = fs::absolute(dir).lexically_normal();
  if (!normal.has_filename()) normal = normal.parent_path();  // "iter_0000020/" names iter_0000020
  const std::string dir_name = normal.filename().string();
  if (is_tmp_dir_name(dir_name))
    fail("checkpoint ", dir.string(), ": this is an unfinished save (a *.tmp directory), not a checkpoint");
  dir_ = dir.string();

  const std::string index_path = (dir / kIndexFile).string();
  if (!fs::exists(index_path)) fail("checkpoint ", dir_, ": missing ", kIndexFile);
  const auto index = ordered_json_parse_checked(file_read_text(index_path), "checkpoint " + index_path);
  try {
    if (index.at("format") != kFormat ||
        (index.at("version") != kVersion && index.at("version") != kVersionBeforeChecksums))
      fail("checkpoint ", index_path, ": expected format '", kFormat, "' version ", kVersionBeforeChecksums, " or ",
           kVersion, ", found ", index.at("format").dump(), " version ", index.at("version").dump());
    const bool has_checksums = index.at("version") != kVersionBeforeChecksums;
    iteration_ = index.at("iteration").get<int64_t>();
    if (iteration_ < 0 || (is_checkpoint_dir_name(dir_name) && checkpoint_dir_name(iteration_) != dir_name))
      fail("checkpoint ", index_path, ": iteration ", iteration_, " does not match its directory ", dir_name);
    world_size_ = index_int(index, "world_size", "checkpoint " + index_path);
    if (world_size_ < 1) fail("checkpoint ", index_path, ": world_size must be >= 1, found ", world_size_);
    const auto file_names = index.at("files").get<std::vector<std::string>>();
    if (static_cast<int>(file_names.size()) != world_size_)
      fail("checkpoint ", index_path, ": expected ", world_size_, " files (one per rank), found ", file_names.size());
    for (size_t r = 0; r < file_names.size(); ++r)
      require_plain_file_name(file_names[r], "checkpoint " + index_path, "rank " + std::to_string(r) + "'s file",
                              dir_);
    plan_ = index.contains("plan") ? nlohmann::json::parse(index["plan"].dump()) : nlohmann::json();

    for (const auto& [name, t] : index.at("tensors").items()) {
      const std::string where = "checkpoint " + index_path + ": tensor '" + name + "'";
      TensorEntry entry;
      auto dtype = safetensors_dtype_parse(t.at("dtype").get<std::string>());
      if (!dtype) fail(where, ": unknown dtype ", t.at("dtype").dump());
      entry.dtype = *dtype;
      entry.shape = t.at("shape").get<std::vector<int64_t>>();
      for (int64_t d : entry.shape)
        if (d < 0) fail(where, ": negative dim in shape ", shape_str(entry.shape));
      std::vector<std::tuple<int64_t, int64_t, int>> ranges;
      for (const auto& s : t.at("shards")) {
        Shard shard;
        shard.rank = index_int(s, "rank", where);
        if (shard.rank < 0 || shard.rank >= world_size_)
          fail(where, ": shard rank ", shard.rank, " out of range for world size ", world_size_);
        if (entry.shape.empty()) {
          shard.row_end = 1;  // the whole 0-dim tensor
        } else {
          const auto rows = s.at("rows").get<std::vector<int64_t>>();
          if (rows.size() != 2 || rows[0] < 0 || rows[0] > rows[1] || rows[1] > entry.shape[0])
            fail(where, ": rank ", shard.rank, " rows ", s.at("rows").dump(), " out of range for shape ",
                 shape_str(entry.shape));
          shard.row_begin = rows[0];
          shard.row_end = rows[1];
          ranges.emplace_back(shard.row_begin, shard.row_end, shard.rank);
          if (shard.row_begin == shard.row_end) continue;  // empty shards hold nothing to read
        }
        if (!s.contains("crc32c") && has_checksums)
          fail(where, ": rank ", shard.rank, "'s shard has no crc32c, which a version ", kVersion,
               " checkpoint records for every shard: the index is damaged (only a version ", kVersionBeforeChecksums,
               " checkpoint, written before checksums, may lack them)");
        if (s.contains("crc32c")) {
          const auto hex = s.at("crc32c").get<std::string>();
          char* end = nullptr;
          const unsigned long value = std::strtoul(hex.c_str(), &end, 16);
          if (hex.size() != 8 || *end != '\0') fail(where, ": rank ", shard.rank, " crc32c '", hex, "' is not 8 hex digits");
          shard.crc32c = static_cast<uint32_t>(value);
        }
        entry.shards.push_back(shard);
      }
      if (entry.shape.empty()) {
        if (entry.shards.size() != 1) fail(where, ": 0-dim tensor needs exactly one shard, found ", entry.shards.size());
      } else {
        check_tiling(ranges, entry.shape[0], where);
      }
      std::sort(entry.shards.begin(), entry.shards.end(),
                [](const Shard& a, const Shard& b) { return a.row_begin < b.row_begin; });
      if (!tensors_.emplace(name, std::move(entry)).second) fail(where, ": listed twice");
      names_.push_back(name);
    }

    for (int r = 0; r < world_size_; ++r) {
      const fs::path file_path = dir / file_names[r];
      try {
        files_.emplace_back(file_path.string(), SafetensorsFile::Symlinks::refuse);
      } catch (const Error& e) {
        fail("checkpoint ", dir_, ": rank ", r, "'s file is unusable: ", e.what());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint ", index_path, ": unexpected structure: ", e.what());
  }

  // Every shard index.json lists must be in its rank file, with the dtype and shape it claims.
  for (const auto& name : names_) {
    const auto& entry = tensors_.at(name);
    for (const auto& shard : entry.shards) {
      const auto& file = files_[shard.rank];
      if (!file.contains(name))
        fail("checkpoint ", dir_, ": index.json puts tensor '", name, "' in ", file.path(),
             " but that file has no such tensor");
      std::vector<int64_t> expected = entry.shape;
      if (!expected.empty()) expected[0] = shard.row_end - shard.row_begin;
      const auto& info = file.info(name);
      if (info.dtype != entry.dtype || info.shape != expected)
        fail("checkpoint ", dir_, ": tensor '", name, "' in ", file.path(), " is ", safetensors_dtype_name(info.dtype),
             " ", shape_str(info.shape), ", index.json says ", safetensors_dtype_name(entry.dtype), " ",
             shape_str(expected));
    }
  }

  const std::string state_path = (dir / kTrainerStateFile).string();
  if (!fs::exists(state_path)) fail("checkpoint ", dir_, ": missing ", kTrainerStateFile);
  global_state_ = json_parse_checked(file_read_text(state_path), "checkpoint " + state_path);
}

std::string CheckpointReader::rank_file(int rank) const {
  if (rank < 0 || rank >= world_size_) fail("checkpoint ", dir_, ": rank ", rank, " of ", world_size_, " ranks requested");
  return files_[rank].path();
}

nlohmann::json CheckpointReader::rank_state(int rank) const {
  if (rank < 0 || rank >= world_size_)
    fail("checkpoint ", dir_, ": rank_state of rank ", rank, " requested, but it was saved by ", world_size_,
         " ranks");
  const auto& meta = files_[rank].metadata();
  auto it = meta.find(kRankStateKey);
  if (it == meta.end()) fail("checkpoint ", files_[rank].path(), ": no '", kRankStateKey, "' in __metadata__");
  return json_parse_checked(it->second, "checkpoint " + files_[rank].path() + ": rank_state");
}

// " rows [a, b)" for a shard of a tensor with rows, "" for a 0-dim one.
std::string CheckpointReader::shard_rows_text(const TensorEntry& entry, const Shard& shard) {
  if (entry.shape.empty()) return "";
  return " rows [" + std::to_string(shard.row_begin) + ", " + std::to_string(shard.row_end) + ")";
}

const CheckpointReader::TensorEntry& CheckpointReader::entry(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("checkpoint ", dir_, ": no tensor named '", name, "' in ", kIndexFile);
  return it->second;
}

std::vector<int64_t> CheckpointReader::global_shape(const std::string& name) const { return entry(name).shape; }

at::ScalarType CheckpointReader::dtype(const std::string& name) const { return entry(name).dtype; }

at::Tensor CheckpointReader::read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const {
  const auto& e = entry(name);
  if (e.shape.empty()) fail("checkpoint ", dir_, ": tensor '", name, "' is 0-dim and has no rows: use read_full");
  if (row_begin < 0 || row_begin > row_end || row_end > e.shape[0])
    fail("checkpoint ", dir_, ": tensor '", name, "' rows [", row_begin, ", ", row_end, ") out of range: it has ",
         e.shape[0], " rows");
  std::vector<int64_t> shape = e.shape;
  shape[0] = row_end - row_begin;
  auto out = at::empty(shape, at::TensorOptions().dtype(e.dtype));
  for (const auto& shard : e.shards) {
    const int64_t lo = std::max(row_begin, shard.row_begin), hi = std::min(row_end, shard.row_end);
    if (lo >= hi) continue;
    if (shard.crc32c && !shard.verified) {
      // First touch: read the whole shard once to check it, and take the rows from that.
      out.narrow(0, lo - row_begin, hi - lo).copy_(read_verified_shard(name, shard).narrow(0, lo - shard.row_begin, hi - lo));
      continue;
    }
    // narrow along dim 0 of a contiguous tensor is itself contiguous: the file reads straight into out.
    files_[shard.rank].read_rows_into(name, lo - shard.row_begin, hi - shard.row_begin,
                                      out.narrow(0, lo - row_begin, hi - lo));
  }
  return out;
}

at::Tensor CheckpointReader::read_full(const std::string& name) const {
  const auto& e = entry(name);
  if (e.shape.empty()) return read_verified_shard(name, e.shards.front());
  return read_rows(name, 0, e.shape[0]);
}

at::Tensor CheckpointReader::read_verified_shard(const std::string& name, const Shard& shard) const {
  const auto& file = files_[shard.rank];
  auto data = file.read(name);
  if (shard.crc32c) {
    const uint32_t crc = crc32c(data.data_ptr(), data.nbytes());
    if (crc != *shard.crc32c)
      fail("checkpoint ", dir_, ": ", file.path(), " is damaged: tensor '", name, "'", shard_rows_text(entry(name), shard),
           " has checksum ", crc32c_hex(crc), ", index.json recorded ", crc32c_hex(*shard.crc32c),
           " when it was saved; restore the file or load an earlier checkpoint (`mmtrain ckpt verify` checks one)");
    shard.verified = true;
  }
  return data;
}

CheckpointReader::VerifyReport CheckpointReader::verify() const {
  VerifyReport report;
  for (const auto& name : names_)
    for (const auto& shard : tensors_.at(name).shards) {
      report.bytes += read_verified_shard(name, shard).nbytes();
      ++(shard.crc32c ? report.shards_checked : report.shards_without_checksum);
    }
  return report;
}

}  // namespace mmtrain
