// Where a `convert` command writes its --save_dir: whole or not at all, never over what is there
// unless asked. The target is locked like a training save root (train/save_root_lock.h: a run
// training into it, or a second conversion, is refused naming the holder); a target holding
// anything but that lock file is refused unless --overwrite; everything is written into a fresh
// staging directory inside it (<save_dir>/.convert-XXXXXX: same filesystem, so every move is a
// rename), and commit() renames the staged entries into place, completion markers (`latest`,
// `.metadata`, `*.index.json`) last, after moving what --overwrite replaces aside. A conversion
// that fails leaves the target as it found it (a target it created is removed), and the lock file
// goes when the conversion ends if it was not there before (an HF or DCP directory holds only its
// own files).
#pragma once
#include "train/save_root_lock.h"

#include <string>

namespace mmtrain {

class ConversionOutput {
 public:
  // command names the caller in messages ("ckpt-to-dcp").
  ConversionOutput(const std::string& save_dir, bool overwrite, const std::string& command);
  ~ConversionOutput();  // removes the staging directory when not committed; never throws
  ConversionOutput(const ConversionOutput&) = delete;
  ConversionOutput& operator=(const ConversionOutput&) = delete;

  // The empty directory to write into.
  const std::string& staging() const { return staging_; }
  // Moves the staged entries into save_dir (replacing what was there: only with overwrite).
  void commit();

 private:
  void clean_up() noexcept;  // what a conversion that did not commit leaves: nothing of its own

  std::string save_dir_, command_, staging_;
  bool created_ = false;      // save_dir did not exist before
  bool lock_existed_ = false;  // nor, when false, its lock file
  bool committed_ = false;
  SaveRootLock lock_;
};

}  // namespace mmtrain
