// A directory of this process's own for temporary files inside a directory it does not own (an
// output_dir): created exclusively under a random name (never an existing directory, never
// through a symlink, never another process's, even one with the same pid in another container),
// and removed with everything in it when the ScratchDir goes, and also when the process is ended
// by SIGTERM, SIGINT or SIGHUP (a signal handler removes it with raw system calls, then the
// signal takes its default course).
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

class ScratchDir {
 public:
  // Creates <parent>/<prefix><12 hex digits>, mode 0700; parent must exist.
  ScratchDir(const std::string& parent, const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  // The random part of the name (48 bits: a double carries it exactly to the other ranks, which
  // rebuild the path with path_of).
  uint64_t id() const { return id_; }
  static std::string path_of(const std::string& parent, const std::string& prefix, uint64_t id);

 private:
  std::string path_;
  std::string absolute_;  // what is removed
  uint64_t id_ = 0;
  int slot_ = -1;  // in the signal handler's table
};

}  // namespace mmtrain
