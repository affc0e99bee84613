#include "train/save_root_lock.h"

#include "core/error.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

namespace mmtrain {
namespace {

std::string read_all(int fd) {
  std::string text;
  char buffer[512];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0 && text.size() < 4096;) text.append(buffer, n);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

std::string this_holder() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  char since[32] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(since, sizeof since, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  return "host " + std::string(host) + ", pid " + std::to_string(::getpid()) + ", since " + since;
}

}  // namespace

SaveRootLock::SaveRootLock(const std::string& save_root, const std::string& label) {
  const std::string path = save_root + "/.mmtrain.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0 && errno == ELOOP)
    fail(label, " '", save_root, "': refused: ", path, " is a symlink (the lock file must be the directory's own)");
  if (fd_ < 0) fail(label, " '", save_root, "': cannot open ", path, ": ", std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = read_all(fd_);
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK)
      fail(label, " '", save_root, "' is in use by another run (", holder.empty() ? "holder unknown" : holder, "; ",
           path, " is locked): two runs saving into one directory would overwrite each other's checkpoints; "
           "stop that run or choose another ", label);
    fail(label, " '", save_root, "': cannot lock ", path, ": ", std::strerror(error));
  }
  previous_holder_ = read_all(fd_);
  const std::string mine = this_holder() + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size()))
    fail(label, " '", save_root, "': cannot write ", path, ": ", std::strerror(errno));
}

SaveRootLock::~SaveRootLock() {
  if (fd_ < 0) return;
  // The file stays, emptied: a later run finds no holder named. (Should that fail, the text names
  // a process that is gone, which the next run reports as taken over: harmless.) The lock goes
  // with the descriptor.
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::close(fd_);
}

}  // namespace mmtrain
