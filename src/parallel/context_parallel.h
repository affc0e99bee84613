// Context parallelism: the tokens of one packed micro-batch split over the CP ranks of the mesh
// (ring x ulysses), attention that communicates so that every row sees exactly what it would see
// unsplit, and the loss sums that make the split invisible.
//
// The split (SequenceShard). T packed rows (samples at cu_seqlens) are padded to T_pad, a
// multiple of M = R * U (x 2 for a causal ring), with rows that belong to no sample: they never
// enter attention, and models keep them out of the loss. The padded stream is cut into R ring
// chunks, one per ring rank: contiguous for full attention, zigzag for causal attention (2R
// pieces; ring rank r takes pieces r and 2R-1-r, which balances the causal work). A ring chunk is
// cut into U contiguous parts, one per Ulysses rank: that part is this rank's local rows.
//
// Attention over local q, k, v [T_loc, H, d]:
//   Ulysses (U > 1): an all-to-all turns [T_loc, H] into [T_ring, H/U] (every Ulysses rank gets
//     the whole ring chunk for its heads); KV heads fewer than U are replicated first, as
//     MindSpeed does; a second all-to-all brings the output back.
//   Ring (R > 1): the ring chunk's q attends to every ring rank's k/v block in turn while the
//     blocks travel around the ring (send/recv), partial results merged through the
//     log-sum-exp; backward sends the blocks around again with their dK/dV, which arrive back at
//     their owner complete. Segments never join rows of different samples, on any step.
//   Hybrid: Ulysses inside, ring across (USP).
// Without context parallelism a model runs the whole sequence (nn/sequence_split.h,
// whole_sequence), so a model has one code path and never includes this file.
//
// Gradients: a rank's loss is the global one (sums and counts over the CP group), but its graph
// holds only its own rows, so its parameter grads are its share; FSDP adds the shares, since it
// shards (and reduce-scatters) over the CP ranks too.
#pragma once
#include "dist/comm.h"
#include "nn/attention.h"
#include "nn/sequence_split.h"

#include <memory>
#include <vector>

namespace mmtrain {

class SequenceShard;

// The Ulysses rule, the one place it is written: the degree must divide the query heads, and
// divide or be divided by the KV heads (fewer KV heads than ranks are replicated, as MindSpeed
// does). Fails naming the config key of the heads that break it.
void check_ulysses_heads(const std::vector<AttentionHeads>& heads, int ulysses);

class ContextParallel : public SequenceSplitter {
 public:
  // ring, ulysses: this rank's groups; cp: their product (the ranks that share one sample stream).
  ContextParallel(std::shared_ptr<Comm> ring, std::shared_ptr<Comm> ulysses, std::shared_ptr<Comm> cp);

  int ways() const override { return cp_->world_size(); }
  // The split of a packed stream with samples at cu_seqlens (from 0 to T); causal attention
  // takes the zigzag ring chunks.
  std::shared_ptr<const SequenceSplit> split(std::vector<int64_t> cu_seqlens, bool causal) const override;
  std::shared_ptr<const SequenceShard> shard(std::vector<int64_t> cu_seqlens, bool causal) const;

  const std::shared_ptr<Comm>& ring() const { return ring_; }
  const std::shared_ptr<Comm>& ulysses() const { return ulysses_; }
  const std::shared_ptr<Comm>& cp() const { return cp_; }

 private:
  std::shared_ptr<Comm> ring_, ulysses_, cp_;
};

class SequenceShard : public SequenceSplit {
 public:
  bool is_split() const override { return true; }
  int size() const { return cp_->world_size(); }               // ranks the stream is split over
  int64_t total_rows() const { return cu_seqlens_.back(); }  // T, without padding
  int64_t padded_rows() const { return padded_rows_; }       // T_pad
  int64_t local_rows() const override { return static_cast<int64_t>(local_index_.size()); }
  const std::vector<int64_t>& cu_seqlens() const { return cu_seqlens_; }
  // Global row of each local row; rows >= T are padding.
  const std::vector<int64_t>& local_index() const { return local_index_; }

  // full [T, ...] -> this rank's rows [local_rows, ...] (differentiable); padding rows hold
  // pad_value.
  at::Tensor take(const at::Tensor& full, double pad_value = 0) const override;
  // [local_rows] bool on device: true on real rows, false on padding.
  at::Tensor real_mask(at::Device device) const;
  // The inverse of take for a forward-only output (a sampler's prediction): every CP rank's
  // local rows [local_rows, ...] -> the whole stream [T, ...] on every rank, padding dropped.
  // Collective over the CP group; not differentiable.
  at::Tensor gather(const at::Tensor& local) const;

  // Attention of local q [T_loc, Hq, d] to local k, v [T_loc, Hkv, d] within each sample.
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) const override;

  // Σ over the CP group of a scalar, every rank getting the total; autograd passes through this
  // rank's own value (its grads are its share).
  at::Tensor sum(const at::Tensor& local) const override;
  // Σ over the CP group of a count.
  int64_t sum(int64_t local) const override;

 private:
  friend class ContextParallel;
  SequenceShard() = default;

  // A contiguous run of global rows, in a ring chunk's row order.
  struct Piece {
    int64_t global_begin = 0, rows = 0;
  };
  // The segments of ring chunk `mine`'s q against ring chunk `source`'s k/v, in ring-chunk-local
  // rows on both sides: within each sample; for causal attention a block before q's is seen
  // fully, the same block causally, a later one not at all.
  std::vector<AttentionSegment> ring_segments(int mine, int source, bool causal) const;

  std::vector<int64_t> cu_seqlens_;
  int64_t padded_rows_ = 0;
  std::vector<int64_t> local_index_;
  std::vector<std::vector<Piece>> ring_chunks_;  // per ring rank, its pieces in order
  std::shared_ptr<Comm> ring_, ulysses_, cp_;
};

}  // namespace mmtrain
