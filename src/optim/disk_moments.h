// AdamW moments on the disk tier (training.offload_dir): each param's exp_avg and exp_avg_sq live
// in regions of the rank's DiskStore file and come into RAM a chunk at a time for the update.
//
// stream() walks every chunk of the given params in order through three windows (each a pair of
// chunk-sized aligned buffers, exp_avg and exp_avg_sq): while chunk k is updated, chunk k+1 is
// being read and chunk k-1 written, all on the store's I/O thread. RAM held: 3 windows x 2 moments
// x chunk_numel x 4 bytes, whatever the model's size.
//
//   chunks:  read(k+1) ─┐
//            update(k)  ├─ overlap
//            write(k-1) ┘
#pragma once
#include "offload/disk_store.h"

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace mmtrain {

class DiskMoments {
 public:
  static constexpr int64_t kMaxChunkNumel = int64_t{1} << 20;  // 4 MiB per moment: 24 MiB of windows
  // training.mem_fraction_static: the chunk whose three windows take at most that share of the
  // device's free memory (unknown: no bound), capped at kMaxChunkNumel (larger chunks hide no more
  // I/O) and at the largest param (on a small model the windows would outweigh the moments), in
  // whole blocks.
  static int64_t chunk_numel_for(double mem_fraction_static, std::optional<int64_t> free_bytes, int64_t largest_numel);
  static int64_t window_bytes_for(int64_t chunk_numel) { return 3 * 2 * aligned_bytes(chunk_numel); }

  // One pair of zero moments per entry of numels (fp32 elements per param), chunks of at most
  // chunk_numel elements.
  DiskMoments(std::shared_ptr<DiskStore> store, const std::vector<int64_t>& numels, int64_t chunk_numel);

  // Calls update(param, begin, exp_avg, exp_avg_sq) for every chunk of each of `params` in order:
  // the two 1-D tensors hold elements [begin, begin + numel) of that param's moments, and what
  // update leaves in them is written back. Returns once every write is done; throws the store's
  // error (file, offset, errno) when a transfer failed.
  using Update = std::function<void(size_t param, int64_t begin, at::Tensor& exp_avg, at::Tensor& exp_avg_sq)>;
  void stream(const std::vector<size_t>& params, const Update& update);

  // A param's moments, read into new tensors (checkpoint saves).
  std::pair<at::Tensor, at::Tensor> read(size_t param) const;
  // Overwrites a param's moments (checkpoint loads).
  void write(size_t param, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq);

  int64_t chunk_numel() const { return chunk_numel_; }
  int64_t window_bytes() const;  // RAM the windows hold
  double wait_ms() const { return wait_ms_; }  // total time stream() waited for the disk
  const DiskStore& store() const { return *store_; }

 private:
  struct Region {
    int64_t numel = 0, exp_avg = 0, exp_avg_sq = 0;  // elements, and the two byte offsets in the file
  };
  struct Window {
    at::Tensor exp_avg, exp_avg_sq;  // aligned, chunk_numel each
    std::shared_future<void> read_avg, read_avg_sq, write_avg, write_avg_sq;
  };
  struct Chunk {
    size_t param;
    int64_t begin, numel;
  };
  void start_read(const Chunk& chunk, Window& window);
  void wait(std::shared_future<void>& transfer);

  std::shared_ptr<DiskStore> store_;
  std::vector<Region> regions_;
  int64_t chunk_numel_;
  std::array<Window, 3> windows_;
  double wait_ms_ = 0;
};

}  // namespace mmtrain
