// Crash-safe file writes for checkpoints: data goes to `path + ".tmp"`, is fsynced, and only then
// renamed onto `path`, so a reader sees either the old file or the complete new one, never a part.
// POSIX only; durability of the rename itself needs dir_fsync on the parent directory.
#pragma once
#include <cstddef>
#include <string>

namespace mmtrain {

// Direct I/O (Direct::when_supported, for big files such as checkpoint shards): the file is
// opened with O_DIRECT and written from an aligned bounce buffer in large aligned blocks, the
// last one padded and the file then truncated to its length. That skips the page cache: on the
// development VM writing 1.2 GB buffered cost 1.7 s of CPU (the copy into the page cache and the
// kernel's writeback threads) against 0.14 s direct, and 2.2 s against 0.7 s of wall time. Where
// the filesystem refuses O_DIRECT (tmpfs, some network filesystems) the file is written buffered.
class AtomicFile {
 public:
  enum class Direct { no, when_supported };
  explicit AtomicFile(std::string path, Direct direct = Direct::no);  // creates (truncates) path + ".tmp"
  ~AtomicFile();  // not committed: closes and removes the .tmp file
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t nbytes);
  // fsync, close, rename onto the final path.
  void commit();
  bool direct() const { return bounce_ != nullptr; }  // O_DIRECT took

 private:
  void write_fully(const void* data, size_t nbytes);  // ::write until done, or fail naming the file
  void flush_bounce(bool last);                        // direct mode: the bounce buffer to the file

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  char* bounce_ = nullptr;  // direct mode: aligned, kBounceBytes
  size_t bounce_filled_ = 0;
  size_t length_ = 0;       // bytes written so far (the file's final length)
};

void file_write_atomic(const std::string& path, const std::string& content);
std::string file_read_text(const std::string& path);
// fsync a directory so renames and creations inside it survive a power loss.
void dir_fsync(const std::string& path);

}  // namespace mmtrain
