#include "io/atomic_file.h"

#include "core/error.h"
#include "core/regular_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

namespace mmtrain {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create ", tmp_path_, ": ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t nbytes) {
  if (fd_ < 0) fail("write to ", path_, " after commit");
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
  require_regular_file(path, path, "a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open ", path, ": ", std::strerror(errno));
  std::ostringstream content;
  content << in.rdbuf();
  if (in.bad()) fail("cannot read ", path);
  return content.str();
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
