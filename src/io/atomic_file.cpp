#include "io/atomic_file.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "io/direct_io.h"
#include "io/user_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mmtrain {

namespace {

constexpr size_t kDirectAlign = kDirectIoAlign;
constexpr size_t kBounceBytes = size_t{8} << 20;

}  // namespace

AtomicFile::AtomicFile(std::string path, Direct direct) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  // A stale .tmp (an interrupted write) goes first; then the file is created new, never through a
  // symlink someone planted at its name.
  ::unlink(tmp_path_.c_str());
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  bool took_direct = false;
  if (direct == Direct::when_supported) {
    fd_ = open_direct_when_supported(tmp_path_, flags, 0644, &took_direct);
    if (took_direct && ::posix_memalign(reinterpret_cast<void**>(&bounce_), kDirectAlign, kBounceBytes) != 0) {
      bounce_ = nullptr;
      ::close(fd_);
      fd_ = -1;
    }
  }
  if (fd_ < 0) fd_ = ::open(tmp_path_.c_str(), flags, 0644);  // buffered
  if (fd_ < 0) fail("cannot create ", tmp_path_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  std::free(bounce_);
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t nbytes) {
  if (fd_ < 0) fail("write to ", path_, " after commit");
  length_ += nbytes;
  if (!bounce_) return write_fully(data, nbytes);
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    const size_t n = std::min(nbytes, kBounceBytes - bounce_filled_);
    std::memcpy(bounce_ + bounce_filled_, p, n);
    bounce_filled_ += n;
    p += n;
    nbytes -= n;
    if (bounce_filled_ == kBounceBytes) flush_bounce(false);
  }
}

void AtomicFile::flush_bounce(bool last) {
  if (bounce_filled_ == 0) return;
  // Only the last block may be partial: padded with zeros to the alignment, cut off by commit().
  const size_t padded = (bounce_filled_ + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
  if (padded != bounce_filled_ && !last) fail("AtomicFile ", path_, ": a partial direct-I/O block before the end");
  std::memset(bounce_ + bounce_filled_, 0, padded - bounce_filled_);
  write_fully(bounce_, padded);
  bounce_filled_ = 0;
}

void AtomicFile::write_fully(const void* data, size_t nbytes) {
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write ", tmp_path_, ": ", std::strerror(errno));
    }
    p += n;
    nbytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) fail("commit of ", path_, " twice");
  if (bounce_) {
    flush_bounce(true);
    if (::ftruncate(fd_, static_cast<off_t>(length_)) != 0)
      fail("cannot truncate ", tmp_path_, " to ", length_, " bytes: ", std::strerror(errno));
  }
  if (::fsync(fd_) != 0) fail("cannot fsync ", tmp_path_, ": ", std::strerror(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    ::unlink(tmp_path_.c_str());
    fail("cannot close ", tmp_path_, ": ", std::strerror(errno));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    fail("cannot rename ", tmp_path_, " to ", path_, ": ", std::strerror(err));
  }
}

void file_write_atomic(const std::string& path, const std::string& content) {
  AtomicFile file(path);
  file.write(content.data(), content.size());
  file.commit();
}

std::string file_read_text(const std::string& path) {
  require_regular_file(path, path, "a file");  // its messages name what was expected
  return read_user_file(path, path, kMaxTextFileBytes);  // checked again on the opened descriptor
}

void dir_fsync(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory ", path, " to fsync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some filesystems (and network ones) refuse fsync on directories; the data itself is synced.
  if (rc != 0 && err != EINVAL && err != ENOTSUP)
    fail("cannot fsync directory ", path, ": ", std::strerror(err));
}

}  // namespace mmtrain
