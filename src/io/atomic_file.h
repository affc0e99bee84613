// Crash-safe file writes for checkpoints: data goes to `path + ".tmp"`, is fsynced, and only then
// renamed onto `path`, so a reader sees either the old file or the complete new one, never a part.
// POSIX only; durability of the rename itself needs dir_fsync on the parent directory.
#pragma once
#include <cstddef>
#include <string>

namespace mmtrain {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);  // creates (truncates) path + ".tmp"
  ~AtomicFile();                          // not committed: closes and removes the .tmp file
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t nbytes);
  // fsync, close, rename onto the final path.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
};

void file_write_atomic(const std::string& path, const std::string& content);
std::string file_read_text(const std::string& path);
// fsync a directory so renames and creations inside it survive a power loss.
void dir_fsync(const std::string& path);

}  // namespace mmtrain
