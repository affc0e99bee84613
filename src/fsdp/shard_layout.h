// The torch.chunk rule FSDP2 shards dim 0 by: every rank holds ceil(dim0 / W) rows, zero-padded;
// the first ranks hold full chunks, later ranks may be short or empty. Checkpoints, resharding
// and interop with PyTorch depend on this exact rule.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace mmtrain {

struct ShardLayout {
  int64_t dim0 = 0;          // rows of the full tensor
  int64_t row_numel = 1;     // elements per row (product of the other dims)
  int64_t padded_rows = 0;   // ceil(dim0 / W): rows every rank stores
  int world_size = 1;

  ShardLayout() = default;
  ShardLayout(const std::vector<int64_t>& shape, int world)
      : dim0(shape.empty() ? 1 : shape[0]), world_size(world) {
    for (size_t d = 1; d < shape.size(); ++d) row_numel *= shape[d];
    padded_rows = (dim0 + world - 1) / world;
  }
  int64_t shard_numel() const { return padded_rows * row_numel; }
  int64_t row_begin(int rank) const { return std::min<int64_t>(rank * padded_rows, dim0); }
  // Real (unpadded) rows rank holds: padded_rows, fewer, or 0.
  int64_t rows(int rank) const {
    return std::clamp<int64_t>(dim0 - rank * padded_rows, 0, padded_rows);
  }
};

}  // namespace mmtrain
