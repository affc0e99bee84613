// AdamW moments swapped out of the device (training.optimizer adamw_swap): each param's exp_avg
// and exp_avg_sq live in regions of a TierStore (offload/tier_store.h: pinned host memory, or the
// rank's file under training.offload_dir) and come to a window a chunk at a time for the update.
//
// stream() walks every chunk of the given params in order through three windows (each a pair of
// chunk-sized buffers, exp_avg and exp_avg_sq), Megatron's reusable windows: while chunk k is
// updated, chunk k+1 is coming in and chunk k-1 going out. Memory held where the update runs:
// 3 windows x 2 moments x chunk_numel x 4 bytes, whatever the model's size.
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

class SwappedMoments {
 public:
  // Chunks are whole blocks of the disk tier (its O_DIRECT alignment), on either tier.
  static constexpr int64_t kFloatsPerBlock = DiskStore::kFloatsPerBlock;
  static constexpr int64_t kMaxChunkNumel = int64_t{1} << 20;  // 4 MiB per moment: 24 MiB of windows
  // training.mem_fraction_static: the chunk whose three windows take at most that share of the
  // free memory where the update runs (the device's; unknown: no bound), capped at kMaxChunkNumel
  // (larger chunks hide no more transfer time) and at the largest param (on a small model the
  // windows would outweigh the moments), in whole blocks.
  static int64_t chunk_numel_for(double mem_fraction_static, std::optional<int64_t> free_bytes, int64_t largest_numel);
  static int64_t window_bytes_for(int64_t chunk_numel) {
    return 3 * 2 * chunk_numel * static_cast<int64_t>(sizeof(float));
  }

  // One pair of zero moments per entry of numels (fp32 elements per param), chunks of at most
  // chunk_numel elements.
  SwappedMoments(std::shared_ptr<TierStore> store, const std::vector<int64_t>& numels, int64_t chunk_numel);

  // Calls update(param, begin, exp_avg, exp_avg_sq) for every chunk of each of `params` in order:
  // the two 1-D tensors hold elements [begin, begin + numel) of that param's moments, and what
  // update leaves in them is written back. Returns once every write is done; throws the store's
  // error (for the disk: file, offset, errno) when a transfer failed.
  using Update = std::function<void(size_t param, int64_t begin, at::Tensor& exp_avg, at::Tensor& exp_avg_sq)>;
  void stream(const std::vector<size_t>& params, const Update& update);

  // A param's moments in host memory, never in a device window (checkpoint saves: see
  // TierStore::read_to_host; the host tier's are its own bytes, to read only).
  std::pair<at::Tensor, at::Tensor> read(size_t param) const;
  // Elements [begin, begin + numel) of one of a param's moments, the same way (a save writes one
  // tensor at a time: the store reads the whole blocks around them).
  at::Tensor read_range(size_t param, bool exp_avg_sq, int64_t begin, int64_t numel) const;
  // Overwrites a param's moments from tensors on any device (checkpoint loads).
  void write(size_t param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

  int64_t chunk_numel() const { return chunk_numel_; }
  int64_t window_bytes() const { return window_bytes_for(chunk_numel_); }  // memory the windows hold
  double wait_ms() const { return wait_ms_; }  // total time stream() waited for transfers
  TierStore& store() const { return *store_; }

 private:
  struct Region {
    int64_t numel = 0, exp_avg = 0, exp_avg_sq = 0;  // elements, and the two byte offsets in the store
  };
  struct Window {
    at::Tensor exp_avg, exp_avg_sq;  // chunk_numel each
    std::shared_future<void> read_avg, read_avg_sq, write_avg, write_avg_sq;
  };
  struct Chunk {
    size_t param;
    int64_t begin, numel;
  };
  void start_read(const Chunk& chunk, Window& window);
  void wait(std::shared_future<void>& transfer);

  std::shared_ptr<TierStore> store_;
  std::vector<Region> regions_;
  int64_t chunk_numel_;
  std::array<Window, 3> windows_;
  double wait_ms_ = 0;
};

}  // namespace mmtrain
