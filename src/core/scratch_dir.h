// A directory of this process's own for temporary files inside a directory it does not own (an
// output_dir): created exclusively under a random name (never an existing directory, never
// through a symlink, never another process's, even one with the same pid in another container),
// and removed with everything in it when the ScratchDir goes, and also when the process is ended
// by SIGTERM, SIGINT or SIGHUP (a signal handler removes it with raw system calls, then the
// signal takes its default course; a signal ignored when the first ScratchDir was made, as under
// nohup, stays ignored).
//
// After its mkdir the directory is used only through a descriptor: path() is /proc/self/fd/N,
// which the kernel resolves to the directory itself, so renaming it and planting a link or
// another directory at its name redirects nothing (the descriptor is inherited by the programs
// this process starts, where the same path names the same directory). Other processes (the other
// ranks) open it by name with ScratchDirView, which checks that they opened the same directory.
#pragma once
#include <array>
#include <cstdint>
#include <string>

namespace mmtrain {

// What another process needs to open a ScratchDir and know it is the same one: its random id and
// its device and inode numbers, as 32-bit halves in doubles (each exact; a collective carries them).
using ScratchDirIdentity = std::array<double, 5>;

class ScratchDir {
 public:
  // Creates <parent>/<prefix><12 hex digits>, mode 0700; parent must exist.
  ScratchDir(const std::string& parent, const std::string& prefix);
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  // /proc/self/fd/N: the directory itself, whatever is renamed or planted at its name later.
  const std::string& path() const { return path_; }
  // <parent>/<prefix><id>: for messages only, never opened.
  const std::string& name_path() const { return name_path_; }
  ScratchDirIdentity identity() const;
  static std::string path_of(const std::string& parent, const std::string& prefix, uint64_t id);

 private:
  std::string path_;
  std::string name_path_;
  uint64_t id_ = 0;
  int slot_ = -1;  // in the signal handler's table, which owns the descriptors
};

// Another process's ScratchDir, opened by name (no link followed) and checked to be the directory
// `identity` describes; fails naming the path when it is not (renamed, replaced, a link).
class ScratchDirView {
 public:
  ScratchDirView(const std::string& parent, const std::string& prefix, const ScratchDirIdentity& identity);
  ~ScratchDirView();
  ScratchDirView(const ScratchDirView&) = delete;
  ScratchDirView& operator=(const ScratchDirView&) = delete;
  const std::string& path() const { return path_; }  // /proc/self/fd/N

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace mmtrain
