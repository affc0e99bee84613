// The disk tier: state that does not stay in RAM (with training.offload_dir: AdamW moments, the 8-bit
// AdamW state, shards under cpu_offload, EMA shadows under ema.offload disk) lives in
// one file per rank, `<offload_dir>/mmtrain_rank_<rank>.offload`, and passes through small RAM
// windows when it is needed. Each tensor owns a region of the file; reads and writes are queued to
// one background I/O thread (pread / pwrite, O_DIRECT where the filesystem allows, so the page
// cache neither doubles the RAM nor costs a copy), so that the caller computes on one chunk while
// the next is read and the previous written.
//
// Alignment: O_DIRECT needs offsets, lengths and buffer addresses aligned to the device's block;
// regions start on kAlign boundaries and transfers move whole kAlign blocks, so the buffers come
// from aligned_buffer() (page-aligned, padded to whole blocks).
//
// The file, `<offload_dir>/mmtrain_rank_<rank>.<pid>.offload`, is created exclusively and unlinked
// at once: it is this process's alone (two jobs with one YAML on one node each get their own), and
// the kernel frees it when the process ends, however it ends; it is scratch space, not a
// checkpoint. Each region's blocks are allocated when it is reserved (posix_fallocate), so a disk
// without room refuses the run at start-up, naming the bytes. An I/O error fails the transfer's
// future with the file, the offset and the errno.
#pragma once
#include "io/direct_io.h"
#include "offload/host_pool.h"
#include "offload/tier_store.h"

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>

namespace mmtrain {

class DiskStore : public TierStore {
 public:
  static constexpr int64_t kAlign = kDirectIoAlign;
  static constexpr int64_t kFloatsPerBlock = kAlign / static_cast<int64_t>(sizeof(float));

  // Creates this process's file for `rank` under dir; fails naming it when it cannot. The windows
  // come from host_pool when one is given (pinned, page-aligned: the host tier's bytes), else
  // from aligned_buffer.
  DiskStore(const std::string& dir, int rank, std::shared_ptr<HostPool> host_pool = nullptr);
  ~DiskStore() override;  // finishes queued transfers and closes the (already unlinked) file
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  // Queued transfers of `bytes` (rounded up to kAlign: the buffer must hold that many) between a
  // kAlign-aligned buffer and the file at `offset`. The future is ready when the bytes moved, and
  // throws what failed.
  std::shared_future<void> read(int64_t offset, void* buffer, int64_t bytes);
  std::shared_future<void> write(int64_t offset, const void* buffer, int64_t bytes);

  // TierStore: the windows are page-aligned RAM buffers of whole blocks, the chunks their slices;
  // regions are whole kAlign blocks at the end of the file.
  const char* tier() const override { return "disk"; }
  at::Tensor window(int64_t numel) override;
  int64_t reserve(int64_t bytes) override;
  std::shared_future<void> read(int64_t offset, at::Tensor chunk) override;
  std::shared_future<void> write(int64_t offset, const at::Tensor& chunk) override;
  at::Tensor read_to_host(int64_t offset, int64_t numel) override;
  void write_from(int64_t offset, const at::Tensor& values) override;
  int64_t size() const override { return end_; }
  std::string describe() const override;

  const std::string& path() const { return path_; }  // the name it was created under (for messages)
  bool direct() const { return direct_; }  // O_DIRECT took
  int64_t bytes_read() const { return bytes_read_; }
  int64_t bytes_written() const { return bytes_written_; }

 private:
  std::shared_future<void> enqueue(std::function<void()> transfer);
  void run();  // the I/O thread

  std::string path_;
  std::shared_ptr<HostPool> host_pool_;
  int fd_ = -1;
  bool direct_ = false;
  int64_t end_ = 0;
  std::atomic<int64_t> bytes_read_{0}, bytes_written_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

// A zeroed fp32 tensor of numel elements that starts on a DiskStore::kAlign boundary and has
// whole blocks of storage after its start (aligned_bytes(numel)), for DiskStore transfers.
at::Tensor aligned_buffer(int64_t numel);

// numel fp32 elements rounded up to whole DiskStore blocks, in bytes.
int64_t aligned_bytes(int64_t numel);

}  // namespace mmtrain
