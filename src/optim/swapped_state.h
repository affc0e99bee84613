// Per-element state swapped out of where its update runs: each param's K fp32 tensors (AdamW's
// exp_avg and exp_avg_sq under training.optimizer adamw_swap, K = 2; the EMA's shadow under
// training.ema.offload, K = 1) live in regions of a TierStore (offload/tier_store.h: pinned host
// memory, or the rank's file under training.offload_dir) and come to a window a chunk at a time.
//
// stream() walks every chunk of the given params in order through three windows (each K
// chunk-sized buffers), Megatron's reusable windows: while chunk k is updated, chunk k+1 is coming
// in and chunk k-1 going out. Memory held where the update runs: 3 windows x K x chunk_numel x 4
// bytes, whatever the model's size.
//
//   chunks:  read(k+1) ─┐
//            update(k)  ├─ overlap
//            write(k-1) ┘
#pragma once
#include "offload/disk_store.h"
#include "offload/tier_store.h"

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace mmtrain {

class SwappedState {
 public:
  // Chunks are whole blocks of the disk tier (its O_DIRECT alignment), on either tier.
  static constexpr int64_t kFloatsPerBlock = DiskStore::kFloatsPerBlock;
  static constexpr int64_t kMaxChunkNumel = int64_t{1} << 20;  // 4 MiB per tensor: 24 MiB of AdamW's windows
  // training.mem_fraction_static: the chunk whose three windows of K tensors take at most that
  // share of the free memory where the update runs (the device's; unknown: no bound), capped at
  // kMaxChunkNumel (larger chunks hide no more transfer time) and at the largest param (on a small
  // model the windows would outweigh the state), in whole blocks.
  static int64_t chunk_numel_for(double mem_fraction_static, std::optional<int64_t> free_bytes, int64_t largest_numel,
                                 int tensors_per_param);
  static int64_t window_bytes_for(int64_t chunk_numel, int tensors_per_param) {
    return 3 * tensors_per_param * chunk_numel * static_cast<int64_t>(sizeof(float));
  }

  // K zeroed tensors per entry of numels (fp32 elements per param), chunks of at most chunk_numel
  // elements.
  SwappedState(std::shared_ptr<TierStore> store, const std::vector<int64_t>& numels, int tensors_per_param,
               int64_t chunk_numel);

  // Calls update(param, begin, chunk) for every chunk of each of `params` in order: chunk[t] holds
  // elements [begin, begin + numel) of that param's tensor t (1-D), and what update leaves in them
  // is written back. Returns once every write is done; throws the store's error (for the disk:
  // file, offset, errno) when a transfer failed.
  using Update = std::function<void(size_t param, int64_t begin, std::vector<at::Tensor>& chunk)>;
  void stream(const std::vector<size_t>& params, const Update& update);

  // Tensor t of a param in host memory, never in a device window (checkpoint saves: see
  // TierStore::read_to_host; the host tier's are its own bytes, to read only).
  at::Tensor read(size_t param, int t) const;
  // Elements [begin, begin + numel) of it, the same way (a save writes one tensor at a time: the
  // store reads the whole blocks around them).
  at::Tensor read_range(size_t param, int t, int64_t begin, int64_t numel) const;
  // Overwrites tensor t of a param from values on any device (checkpoint loads).
  void write(size_t param, int t, const at::Tensor& values);

  int tensors_per_param() const { return tensors_per_param_; }
  int64_t chunk_numel() const { return chunk_numel_; }
  int64_t window_bytes() const { return window_bytes_for(chunk_numel_, tensors_per_param_); }
  double wait_ms() const { return wait_ms_; }  // total time stream() waited for transfers
  TierStore& store() const { return *store_; }

 private:
  struct Region {
    int64_t numel = 0;
    std::vector<int64_t> offsets;  // each tensor's byte offset in the store
  };
  struct Window {
    std::vector<at::Tensor> buffers;                  // K, chunk_numel each
    std::vector<std::shared_future<void>> reads, writes;  // K each
  };
  struct Chunk {
    size_t param;
    int64_t begin, numel;
  };
  void start_read(const Chunk& chunk, Window& window);
  void wait(std::shared_future<void>& transfer);

  std::shared_ptr<TierStore> store_;
  int tensors_per_param_;
  std::vector<Region> regions_;
  int64_t chunk_numel_;
  std::array<Window, 3> windows_;
  double wait_ms_ = 0;
};

}  // namespace mmtrain
