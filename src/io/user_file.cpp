#include "io/user_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace mmtrain {

namespace {

std::string describe_type(mode_t mode) {
  return S_ISDIR(mode) ? "a directory" : S_ISLNK(mode) ? "a symlink" : "a FIFO, device or socket";
}

void require_no_nul(const std::string& path, const std::string& label) {
  if (path.find('\0') != std::string::npos)
    fail(label.substr(0, label.find('\0')), "\\0...: the path contains a NUL byte");
}

}  // namespace

namespace {

// The one open of a file to read: O_NONBLOCK (opening a FIFO would otherwise wait for a writer
// forever), O_NOFOLLOW where asked, the type and size checked on the descriptor. No file at all
// sets *missing when `missing_ok`, and is an error otherwise.
std::string read_checked(const std::string& path, const std::string& label, int64_t max_bytes, bool follow_links,
                         bool missing_ok, bool* missing) {
  require_no_nul(path, label);
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | (follow_links ? 0 : O_NOFOLLOW));
  if (fd < 0) {
    if (errno == ENOENT && missing_ok) {
      *missing = true;
      return {};
    }
    if (errno == ENOENT) fail(label, ": no such file");
    if (errno == ELOOP) fail(label, ": refused: ", path, " is a symlink (a file of a run's own directory is never a link)");
    fail(label, ": cannot be opened: ", std::strerror(errno));
  }
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(label, ": cannot be inspected: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(label, ": not a regular file (", describe_type(st.st_mode), ")");
  if (st.st_size > max_bytes)
    fail(label, ": ", static_cast<long long>(st.st_size), " bytes, over the ", static_cast<long long>(max_bytes),
         " bytes this kind of file may hold");
  // Regular files never block; clear the flag all the same so reads behave as usual.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t filled = 0;
  while (true) {
    if (filled == content.size()) {
      // The file may have grown since fstat: read on, up to the cap.
      if (static_cast<int64_t>(content.size()) >= max_bytes) {
        char probe;
        const ssize_t more = ::read(fd, &probe, 1);
        if (more > 0) fail(label, ": grew past the ", static_cast<long long>(max_bytes), " bytes this kind of file may hold");
        break;
      }
      content.resize(std::min<size_t>(static_cast<size_t>(max_bytes), content.size() * 2 + 4096));
    }
    const ssize_t got = ::read(fd, content.data() + filled, content.size() - filled);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(label, ": cannot be read: ", std::strerror(errno));
    }
    if (got == 0) break;
    filled += static_cast<size_t>(got);
  }
  content.resize(filled);
  return content;
}

}  // namespace

std::string read_user_file(const std::string& path, const std::string& label, int64_t max_bytes) {
  bool missing = false;
  return read_checked(path, label, max_bytes, /*follow_links=*/true, /*missing_ok=*/false, &missing);
}

std::optional<std::string> read_run_file(const std::string& path, const std::string& label, int64_t max_bytes) {
  bool missing = false;
  std::string content = read_checked(path, label, max_bytes, /*follow_links=*/false, /*missing_ok=*/true, &missing);
  if (missing) return std::nullopt;
  return content;
}

int create_new_file(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
}

namespace {

// A symlink at path (dangling included) or a non-regular file there is refused.
void require_writable_target(const std::string& path, const std::string& label) {
  require_no_nul(path, label);
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail(label, ": cannot be inspected: ", std::strerror(errno));
  }
  if (S_ISLNK(st.st_mode))
    fail(label, ": refused: ", path, " is a symlink (mmtrain writes its files in place, never through a link)");
  if (!S_ISREG(st.st_mode)) fail(label, ": refused: ", path, " is ", describe_type(st.st_mode), ", not a file");
}

}  // namespace

std::string not_a_directory(const std::string& path) {
  struct stat info {};
  if (::lstat(path.c_str(), &info) != 0) return errno == ENOENT ? "" : std::string("unreadable (") + std::strerror(errno) + ")";
  if (S_ISDIR(info.st_mode)) return "";
  return S_ISLNK(info.st_mode) ? "a symbolic link" : "not a directory";
}

void write_file_no_follow(const std::string& path, const std::string& content, const std::string& label) {
  require_writable_target(path, label);
  static std::atomic<int64_t> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const int fd = create_new_file(tmp);
  if (fd < 0) fail(label, ": cannot create ", tmp, ": ", std::strerror(errno));
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      fail(label, ": cannot write ", tmp, ": ", std::strerror(err));
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail(label, ": cannot write ", path, ": ", std::strerror(err));
  }
}

std::FILE* open_append_no_follow(const std::string& path, const std::string& label, bool binary) {
  require_writable_target(path, label);
  // O_NONBLOCK: a FIFO planted between the lstat above and this open must not block it (a FIFO
  // without a reader fails with ENXIO; one with a reader is refused on the descriptor below).
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0 && errno == ENXIO) fail(label, ": refused: ", path, " is a FIFO, not a file");
  if (fd < 0) fail(label, ": cannot open ", path, " for appending: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(label, ": refused: ", path, " is not a regular file");
  }
  // A regular file: writes block as usual (a full disk is an error, not EAGAIN).
  if (::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    fail(label, ": cannot open ", path, ": ", std::strerror(err));
  }
  std::FILE* file = ::fdopen(fd, binary ? "ab" : "a");
  if (!file) {
    const int err = errno;
    ::close(fd);
    fail(label, ": cannot open ", path, ": ", std::strerror(err));
  }
  return file;
}

}  // namespace mmtrain
