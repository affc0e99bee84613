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

// The paths the handler removes: fixed buffers, written before a slot is published.
constexpr int kSlots = 4;
constexpr size_t kMaxPath = 4096;
struct Slot {
  std::atomic<bool> used{false};
  std::atomic<bool> live{false};
  char path[kMaxPath];
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
void remove_tree_at(int parent_fd, const char* name, int depth) {
  if (::unlinkat(parent_fd, name, 0) == 0 || depth > 16) return;
  const int fd = ::openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
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
  ::close(fd);
  ::unlinkat(parent_fd, name, AT_REMOVEDIR);
}

void remove_live_slots_and_reraise(int signal_number) {
  for (auto& slot : slots)
    if (slot.live.load()) remove_tree_at(AT_FDCWD, slot.path, 0);
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

void install_handlers_once() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  for (const int signal_number : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction action {};
    action.sa_handler = remove_live_slots_and_reraise;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal_number, &action, nullptr);
  }
}

}  // namespace

std::string ScratchDir::path_of(const std::string& parent, const std::string& prefix, uint64_t id) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%012llx", static_cast<unsigned long long>(id));
  return (std::filesystem::path(parent) / (prefix + hex)).string();
}

ScratchDir::ScratchDir(const std::string& parent, const std::string& prefix) {
  std::random_device entropy;
  for (int attempt = 0;; ++attempt) {
    id_ = ((uint64_t{entropy()} << 32) | entropy()) & ((uint64_t{1} << 48) - 1);
    path_ = path_of(parent, prefix, id_);
    if (::mkdir(path_.c_str(), 0700) == 0) break;  // mkdir never follows a link at the name
    if (errno != EEXIST || attempt == 16) fail("cannot create a scratch directory ", path_, ": ", std::strerror(errno));
  }
  // An absolute path for the removal: the working directory may change before it.
  absolute_ = std::filesystem::absolute(path_).string();
  if (absolute_.size() < kMaxPath) {
    for (int i = 0; i < kSlots; ++i) {
      if (slots[i].used.exchange(true)) continue;
      std::memcpy(slots[i].path, absolute_.c_str(), absolute_.size() + 1);
      slots[i].live.store(true);
      slot_ = i;
      break;
    }
  }
  install_handlers_once();
}

ScratchDir::~ScratchDir() {
  if (slot_ >= 0) {
    slots[slot_].live.store(false);
    slots[slot_].used.store(false);
  }
  remove_tree_at(AT_FDCWD, absolute_.c_str(), 0);
}

}  // namespace mmtrain
