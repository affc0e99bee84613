#include "core/scratch_dir.h"

#include "core/error.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

namespace mmtrain {
namespace {

// The directories the handler removes: descriptors of the parent and of the directory, its name
// and its identity, written before a slot is published.
constexpr int kSlots = 4;
constexpr size_t kMaxName = 256;
struct Slot {
  std::atomic<bool> used{false};
  std::atomic<bool> live{false};
  int parent_fd = -1;
  int dir_fd = -1;
  dev_t device = 0;
  ino_t inode = 0;
  char name[kMaxName];
};
std::array<Slot, kSlots> slots;

struct LinuxDirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

bool is_dot(const char* name) { return name[0] == '.' && (name[1] == 0 || (name[1] == '.' && name[2] == 0)); }

// Removes name under parent_fd and everything below it, with async-signal-safe calls only
// (openat, getdents64, unlinkat, lseek, close); links are removed, never followed.
void remove_tree_at(int parent_fd, const char* name, int depth);

// Removes everything inside the directory open at fd (links removed, never followed).
void remove_entries_at(int fd, int depth = 0) {
  alignas(8) char buffer[8192];
  for (int pass = 0; pass < 64; ++pass) {  // entries removed while listing: list again until empty
    bool removed_any = false;
    ::lseek(fd, 0, SEEK_SET);
    for (;;) {
      const long n = ::syscall(SYS_getdents64, fd, buffer, sizeof buffer);
      if (n <= 0) break;
      for (long offset = 0; offset < n;) {
        auto* entry = reinterpret_cast<LinuxDirent64*>(buffer + offset);
        offset += entry->d_reclen;
        if (is_dot(entry->d_name)) continue;
        remove_tree_at(fd, entry->d_name, depth + 1);
        removed_any = true;
      }
    }
    if (!removed_any) break;
  }
}

void remove_tree_at(int parent_fd, const char* name, int depth) {
  if (::unlinkat(parent_fd, name, 0) == 0 || depth > 16) return;
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  remove_entries_at(fd, depth);
  ::close(fd);
  ::unlinkat(parent_fd, name, AT_REMOVEDIR);
}

// Empties the directory through its descriptor, then removes its name from the parent only when
// that name still is this directory (a rename may have put something else there).
void remove_slot(const Slot& slot) {
  remove_entries_at(slot.dir_fd);
  struct stat info {};
  if (::fstatat(slot.parent_fd, slot.name, &info, AT_SYMLINK_NOFOLLOW) == 0 && info.st_dev == slot.device &&
      info.st_ino == slot.inode)
    ::unlinkat(slot.parent_fd, slot.name, AT_REMOVEDIR);
}

void remove_live_slots_and_reraise(int signal_number) {
  for (auto& slot : slots)
    if (slot.live.load()) remove_slot(slot);
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

// A signal ignored at the first ScratchDir (nohup's SIGHUP, a shell's background SIGINT) stays
// ignored: the handler would make it fatal.
void install_handlers_once() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (const int signal_number : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = remove_live_slots_and_reraise;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
  }
}

std::string descriptor_path(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

double high_word(uint64_t value) { return static_cast<double>(value >> 32); }
double low_word(uint64_t value) { return static_cast<double>(value & 0xffffffffu); }
uint64_t from_words(double high, double low) {
  return (static_cast<uint64_t>(high) << 32) | static_cast<uint64_t>(low);
}

}  // namespace

std::string ScratchDir::path_of(const std::string& parent, const std::string& prefix, uint64_t id) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%012llx", static_cast<unsigned long long>(id));
  return (std::filesystem::path(parent) / (prefix + hex)).string();
}

ScratchDir::ScratchDir(const std::string& parent, const std::string& prefix) {
  const int parent_fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (parent_fd < 0) fail("cannot open ", parent, " for a scratch directory: ", std::strerror(errno));
  std::random_device entropy;
  std::string name;
  for (int attempt = 0;; ++attempt) {
    id_ = ((uint64_t{entropy()} << 32) | entropy()) & ((uint64_t{1} << 48) - 1);
    name = std::filesystem::path(path_of("", prefix, id_)).filename().string();
    if (name.size() >= kMaxName) {
      ::close(parent_fd);
      fail("scratch directory prefix '", prefix, "' is too long");
    }
    if (::mkdirat(parent_fd, name.c_str(), 0700) == 0) break;  // mkdir never follows a link at the name
    if (errno != EEXIST || attempt == 16) {
      const int error = errno;
      ::close(parent_fd);
      fail("cannot create a scratch directory in ", parent, ": ", std::strerror(error));
    }
  }
  name_path_ = path_of(parent, prefix, id_);
  // Not O_CLOEXEC: the programs this process starts inherit it, and /proc/self/fd/N names the
  // same directory there.
  const int dir_fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  struct stat info {};
  if (dir_fd < 0 || ::fstat(dir_fd, &info) != 0) {
    const int error = errno;
    ::close(parent_fd);
    fail("cannot open the scratch directory ", name_path_, " just made: ", std::strerror(error));
  }
  for (int i = 0; i < kSlots && slot_ < 0; ++i) {
    if (slots[i].used.exchange(true)) continue;
    auto& slot = slots[i];
    slot.parent_fd = parent_fd;
    slot.dir_fd = dir_fd;
    slot.device = info.st_dev;
    slot.inode = info.st_ino;
    std::memcpy(slot.name, name.c_str(), name.size() + 1);
    slot.live.store(true);
    slot_ = i;
  }
  if (slot_ < 0) {
    ::close(dir_fd);
    ::close(parent_fd);
    fail("more than ", kSlots, " scratch directories at once in one process");
  }
  path_ = descriptor_path(dir_fd);
  install_handlers_once();
}

ScratchDirIdentity ScratchDir::identity() const {
  const auto& slot = slots[slot_];
  return {static_cast<double>(id_), high_word(slot.device), low_word(slot.device), high_word(slot.inode),
          low_word(slot.inode)};
}

ScratchDir::~ScratchDir() {
  auto& slot = slots[slot_];
  slot.live.store(false);
  remove_slot(slot);
  ::close(slot.dir_fd);
  ::close(slot.parent_fd);
  slot.used.store(false);
}

ScratchDirView::ScratchDirView(const std::string& parent, const std::string& prefix, const ScratchDirIdentity& identity) {
  const std::string name = ScratchDir::path_of(parent, prefix, static_cast<uint64_t>(identity[0]));
  fd_ = ::open(name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd_ < 0) fail("cannot open the scratch directory ", name, ": ", std::strerror(errno));
  struct stat info {};
  const bool same = ::fstat(fd_, &info) == 0 && info.st_dev == from_words(identity[1], identity[2]) &&
                    info.st_ino == from_words(identity[3], identity[4]);
  if (!same) {
    ::close(fd_);
    fd_ = -1;
    fail("the scratch directory ", name, " is not the one rank 0 made (renamed or replaced while in use)");
  }
  path_ = descriptor_path(fd_);
}

ScratchDirView::~ScratchDirView() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace mmtrain
