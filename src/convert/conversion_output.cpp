#include "convert/conversion_output.h"

#include "core/error.h"
#include "io/atomic_file.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

constexpr const char* kLockFile = ".mmtrain.lock";
constexpr const char* kStagingPrefix = ".convert-";

// Creates save_dir when missing; says whether it did. Before the lock: the lock file lives in it.
bool create_target(const std::string& save_dir, const std::string& command) {
  if (fs::exists(fs::symlink_status(save_dir))) {
    if (!fs::is_directory(fs::symlink_status(save_dir)))
      fail(command, ": --save_dir ", save_dir, " exists and is not a directory");
    return false;
  }
  fs::create_directories(save_dir);
  return true;
}

// What save_dir holds besides the lock file and staging directories, by name.
std::vector<std::string> existing_entries(const std::string& save_dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(save_dir)) {
    const std::string name = entry.path().filename().string();
    if (name != kLockFile && name.rfind(kStagingPrefix, 0) != 0) names.push_back(name);
  }
  return names;
}

bool is_completion_marker(const std::string& name) {
  const std::string index_suffix = ".index.json";
  return name == "latest" || name == ".metadata" ||
         (name.size() > index_suffix.size() && name.compare(name.size() - index_suffix.size(), index_suffix.size(), index_suffix) == 0);
}

}  // namespace

ConversionOutput::ConversionOutput(const std::string& save_dir, bool overwrite, const std::string& command)
    : save_dir_(save_dir),
      command_(command),
      created_(create_target(save_dir, command)),
      lock_existed_(fs::exists(fs::symlink_status(fs::path(save_dir) / kLockFile))),
      lock_(save_dir, command + " --save_dir") {
  try {
    if (const auto there = existing_entries(save_dir); !there.empty() && !overwrite) {
      std::string listed;
      for (size_t i = 0; i < there.size() && i < 3; ++i) listed += (i ? ", " : "") + there[i];
      if (there.size() > 3) listed += ", ... (" + std::to_string(there.size()) + " entries)";
      fail(command, ": --save_dir ", save_dir, " is not empty (it holds ", listed, "): refusing to write over it; "
           "choose an empty or new directory, or pass --overwrite to replace its contents");
    }
    std::string pattern = (fs::path(save_dir) / (std::string(kStagingPrefix) + "XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      fail(command, ": cannot create a staging directory in ", save_dir, ": ", std::strerror(errno));
    staging_ = pattern;
  } catch (...) {
    clean_up();  // no destructor runs for a constructor that throws
    throw;
  }
}

ConversionOutput::~ConversionOutput() { clean_up(); }

void ConversionOutput::clean_up() noexcept {
  std::error_code ignored;
  // Removed while still held (the descriptor closes after): a waiter would fail, not wait.
  if (!lock_existed_) fs::remove(fs::path(save_dir_) / kLockFile, ignored);
  if (committed_) return;
  if (!staging_.empty()) fs::remove_all(staging_, ignored);
  if (created_) fs::remove(save_dir_, ignored);  // only when empty: nothing else was there
}

void ConversionOutput::commit() {
  // What --overwrite replaces moves aside first (into the staging directory's sibling), so that
  // the target never holds a mix of the old and the new.
  std::string replaced_pattern = (fs::path(save_dir_) / (std::string(kStagingPrefix) + "replaced-XXXXXX")).string();
  const auto old_entries = existing_entries(save_dir_);
  if (!old_entries.empty()) {
    if (::mkdtemp(replaced_pattern.data()) == nullptr)
      fail(command_, ": cannot create a directory for the replaced entries in ", save_dir_, ": ", std::strerror(errno));
    for (const auto& name : old_entries) fs::rename(fs::path(save_dir_) / name, fs::path(replaced_pattern) / name);
  }
  std::vector<std::string> markers;
  for (const auto& entry : fs::directory_iterator(staging_)) {
    const std::string name = entry.path().filename().string();
    if (is_completion_marker(name)) {
      markers.push_back(name);
      continue;
    }
    fs::rename(entry.path(), fs::path(save_dir_) / name);
  }
  dir_fsync(save_dir_);
  for (const auto& name : markers) fs::rename(fs::path(staging_) / name, fs::path(save_dir_) / name);
  dir_fsync(save_dir_);
  fs::remove(staging_);
  committed_ = true;
  if (!old_entries.empty()) fs::remove_all(replaced_pattern);
}

}  // namespace mmtrain
