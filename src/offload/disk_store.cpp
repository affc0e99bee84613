#include "offload/disk_store.h"

#include "core/error.h"
#include "io/direct_io.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

namespace mmtrain {
namespace {

int64_t round_up(int64_t bytes) { return (bytes + DiskStore::kAlign - 1) / DiskStore::kAlign * DiskStore::kAlign; }

// This process's file for the rank: the pid keeps two jobs on one node (the same YAML, the same
// offload_dir) apart.
std::string rank_file(const std::string& dir, int rank) {
  char name[64];
  std::snprintf(name, sizeof name, "mmtrain_rank_%05d.%d.offload", rank, static_cast<int>(::getpid()));
  return (std::filesystem::path(dir) / name).string();
}

// Free bytes of the filesystem holding dir (for a refusal's message); -1 when unknown.
int64_t free_bytes(const std::string& path) {
  struct statvfs fs {};
  if (::statvfs(std::filesystem::path(path).parent_path().c_str(), &fs) != 0) return -1;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

}  // namespace

int64_t aligned_bytes(int64_t numel) { return round_up(numel * static_cast<int64_t>(sizeof(float))); }

at::Tensor aligned_buffer(int64_t numel) {
  // From ATen's allocator (so that memory accounting sees it), one block longer than needed; the
  // view starts at the first block boundary in it (the allocator's 64-byte alignment keeps the
  // offset a whole number of floats).
  const at::Tensor storage =
      at::zeros({aligned_bytes(numel) / static_cast<int64_t>(sizeof(float)) + DiskStore::kFloatsPerBlock});
  const auto address = reinterpret_cast<uintptr_t>(storage.data_ptr());
  const auto offset = static_cast<int64_t>((DiskStore::kAlign - address % DiskStore::kAlign) % DiskStore::kAlign);
  return storage.narrow(0, offset / static_cast<int64_t>(sizeof(float)), numel);
}

DiskStore::DiskStore(const std::string& dir, int rank, std::shared_ptr<HostPool> host_pool)
    : path_(rank_file(dir, rank)), host_pool_(std::move(host_pool)) {
  // Created exclusively (never another job's file), then reopened with O_DIRECT where the
  // filesystem takes it, then unlinked: the file is this process's alone, reachable only through
  // its descriptor, and the kernel frees it when the process ends, however it ends.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0) fail("training.offload_dir: cannot create ", path_, ": ", std::strerror(errno));
  const int direct_fd = open_direct_when_supported(path_, O_RDWR | O_CLOEXEC, 0600, &direct_);
  if (direct_fd >= 0 && direct_) {
    ::close(fd_);
    fd_ = direct_fd;
  } else if (direct_fd >= 0) {
    ::close(direct_fd);
  }
  ::unlink(path_.c_str());
  thread_ = std::thread([this] { run(); });
}

DiskStore::~DiskStore() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
  ::close(fd_);  // the file was unlinked at creation: its blocks go with the descriptor
}

int64_t DiskStore::reserve(int64_t bytes) {
  const int64_t offset = end_;
  end_ += round_up(bytes);
  if (end_ == offset) return offset;  // an empty region (a unit of frozen params only): nothing to allocate
  // The region's blocks are allocated now (they read as zeros until written), so that a disk
  // without room refuses the run here, at start-up, not in the middle of a step.
  if (const int error = ::posix_fallocate(fd_, offset, end_ - offset); error != 0) {
    const int64_t free = free_bytes(path_);
    fail("training.offload_dir: cannot reserve ", end_ - offset, " more bytes in ", path_, " (", end_,
         " bytes for this rank's file): ", std::strerror(error),
         free >= 0 ? "; the filesystem has " + std::to_string(free) + " bytes free" : std::string(),
         " (each rank of each job on the node needs its own file: plan's disk bytes)");
  }
  return offset;
}

std::shared_future<void> DiskStore::read(int64_t offset, void* buffer, int64_t bytes) {
  const int64_t length = round_up(bytes);
  return enqueue([this, buffer, offset, length] {
    for (int64_t done = 0; done < length;) {
      const ssize_t n = ::pread(fd_, static_cast<char*>(buffer) + done, length - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail("offload file ", path_, ": reading ", length, " bytes at offset ", offset, " failed: ",
             n == 0 ? std::string("unexpected end of file") : std::string(std::strerror(errno)));
      done += n;
    }
    bytes_read_ += length;
  });
}

std::shared_future<void> DiskStore::write(int64_t offset, const void* buffer, int64_t bytes) {
  const int64_t length = round_up(bytes);
  return enqueue([this, buffer, offset, length] {
    for (int64_t done = 0; done < length;) {
      const ssize_t n = ::pwrite(fd_, static_cast<const char*>(buffer) + done, length - done, offset + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        fail("offload file ", path_, ": writing ", length, " bytes at offset ", offset, " failed: ",
             std::strerror(errno));
      done += n;
    }
    bytes_written_ += length;
  });
}

std::shared_future<void> DiskStore::enqueue(std::function<void()> transfer) {
  std::packaged_task<void()> task(std::move(transfer));
  std::shared_future<void> done = task.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return done;
}

void DiskStore::run() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and every queued transfer ran
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();  // an exception lands in the task's future
  }
}

at::Tensor DiskStore::window(int64_t numel) {
  if (!host_pool_) return aligned_buffer(numel);
  // The pool's buffers start on a page and hold whole pages: whole blocks after the start.
  static_assert(kAlign <= 4096, "the host pool aligns to 4096-byte pages");
  return host_pool_->take_zeros({aligned_bytes(numel) / static_cast<int64_t>(sizeof(float))}, at::kFloat)
      .narrow(0, 0, numel);
}

std::shared_future<void> DiskStore::read(int64_t offset, at::Tensor chunk) {
  return read(offset, chunk.data_ptr(), chunk.numel() * static_cast<int64_t>(sizeof(float)));
}

std::shared_future<void> DiskStore::write(int64_t offset, const at::Tensor& chunk) {
  return write(offset, chunk.data_ptr(), chunk.numel() * static_cast<int64_t>(sizeof(float)));
}

// Checkpoint buffers come from ATen's allocator, not the pool: a save's sizes are many and
// passing, and the pool would keep one buffer of each size after it.
at::Tensor DiskStore::read_to_host(int64_t offset, int64_t numel) {
  at::Tensor buffer = aligned_buffer(numel);
  read(offset, buffer).get();
  return buffer;
}

void DiskStore::write_from(int64_t offset, const at::Tensor& values) {
  at::Tensor buffer = aligned_buffer(values.numel());
  buffer.copy_(values.reshape(-1));
  write(offset, buffer).get();
}

std::string DiskStore::describe() const {
  return "on disk in " + path_ + (direct_ ? " (direct I/O" : " (buffered I/O") +
         "; unlinked at creation: this run's alone, gone when it ends)";
}

}  // namespace mmtrain
