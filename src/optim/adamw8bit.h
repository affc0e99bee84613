// bitsandbytes' blockwise 8-bit AdamW (bnb.optim.AdamW8bit, 0.50) over flat fp32 FSDP shards:
// exp_avg as uint8 codes on the signed dynamic map, exp_avg_sq on the unsigned one
// (quant/dynamic_map.h), in blocks of 256 elements of each param, each block with an fp32 absmax;
// params below min_8bit_size elements keep fp32 moments. Both updates are bitsandbytes' CPU ops
// (backends/cpu/ops.py), the same ATen ops in the same order, so a step is bitwise theirs:
//
//   8-bit:  m, v = dequantize(codes, absmax)
//           m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//           p = p (1 - lr wd)                                          (wd > 0)
//           p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
//           codes, absmax = quantize(m, v)   (absmax = max |.| over the block)
//   32-bit: m, v as above;  p = p (1 - lr wd);
//           p = p + (-lr sqrt(1 - b2^t) / (1 - b1^t)) * m / (sqrt(v) + eps sqrt(1 - b2^t))
//
// Blocks are counted from each param's first element, as bitsandbytes counts them, not from the
// shard's: FSDP cuts a param at row boundaries, so a block may straddle two ranks (rows of 100
// elements put the cut at element 100 of block 0). Such a block's absmax is the max over every
// rank's part of it: each rank updates its elements, holds their new fp32 moments aside, and one
// all-reduce (max) per step over the straddling blocks of every param gives each its absmax
// before those elements are quantized. Each rank stores the absmax of every block it touches
// (the straddling ones on both sides); a checkpoint writes each block once, from the rank that
// holds its first element. So W ranks store what 1 rank does, bitwise (ATen's elementwise ops
// give the same bits wherever an element falls in a vector), and a checkpoint reshards like the
// weights.
#pragma once
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "quant/dynamic_map.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

namespace mmtrain {

// A trained param's place in its unit's flat shard.
struct ShardedParamSpan {
  std::string name;                  // for errors
  int64_t shard_offset = 0;          // where this rank's rows of it start in the unit's flat shard
  int64_t numel = 0;                 // of the whole param
  std::vector<int64_t> rank_begins;  // [W + 1]: the element each rank's rows start at, then numel
};

struct AdamW8bitOptions {
  AdamWOptions adamw;
  int64_t min_8bit_size = 4096;  // params with fewer elements keep fp32 moments (bitsandbytes' rule)
};

class AdamW8bit : public Optimizer {
 public:
  static constexpr int64_t kBlocksize = 256;
  // Blocks of a param of numel elements (the absmax per moment it has).
  static int64_t blocks_of(int64_t numel) { return (numel + kBlocksize - 1) / kBlocksize; }
  // The dynamic map of moment 0 (exp_avg: signed) or 1 (exp_avg_sq: unsigned).
  static quant::DynamicMap map_of(int moment) {
    return moment ? quant::DynamicMap::unsigned_values : quant::DynamicMap::signed_values;
  }
  // The collective that gives the straddling blocks their absmax: an in-place max over the
  // ranks that shard the params (the FSDP shard group), on a CPU fp32 tensor.
  using AllReduceMax = std::function<void(at::Tensor&)>;
  // Zeroed state where the param is (fsdp cpu_offload: the host tier); null: at::zeros.
  using StateAllocator = std::function<at::Tensor(int64_t numel, at::ScalarType dtype, const at::Tensor& param)>;

  // params, grads: each unit's flat fp32 shard and grad, the same objects all run; spans[i]: the
  // trained params in params[i], in order; rank: this rank's index in every span's rank_begins.
  AdamW8bit(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<std::vector<ShardedParamSpan>> spans,
            int rank, AdamW8bitOptions options, AllReduceMax all_reduce_max, StateAllocator allocate = nullptr);

  void step(double lr) override;
  int64_t state_bytes() const override;
  int64_t min_8bit_size() const { return options_.min_8bit_size; }
  // What state_bytes() will be on `rank` for these spans over flat shards of shard_numel elements
  // in all (the planner's figure): 2 bytes of codes per shard element, 8 per touched block's two
  // absmax, 8 per element of a param below min_8bit_size.
  static int64_t state_bytes_for(int64_t shard_numel, const std::vector<ShardedParamSpan>& spans, int rank,
                                 int64_t min_8bit_size);

  // Checkpoint access to param `name` of unit i (its rows, as the weights). moment: 0 exp_avg, 1
  // exp_avg_sq.
  bool is_8bit(size_t i, const std::string& name) const;
  // 8-bit: the codes of this rank's elements, uint8 [numel] (a view: the live state).
  at::Tensor codes(size_t i, const std::string& name, int moment) const;
  // 8-bit: the absmax of every block this rank's elements touch, fp32 [blocks], from block
  // first_block() (a view); the blocks whose first element this rank holds: owned_blocks().
  at::Tensor absmax(size_t i, const std::string& name, int moment) const;
  int64_t first_block(size_t i, const std::string& name) const;
  std::pair<int64_t, int64_t> owned_blocks(size_t i, const std::string& name) const;  // [begin, end)
  // 32-bit: this rank's elements of the moment, fp32 [numel] (a view).
  at::Tensor moment(size_t i, const std::string& name, int moment) const;

 private:
  struct Span {
    ShardedParamSpan param;
    int64_t begin = 0, end = 0;  // this rank's elements of the param
    bool eight_bit = false;
    int64_t first_block = 0, blocks = 0, absmax_at = 0;  // blocks touched, and where theirs start in the unit's absmax
    int64_t small_at = 0;                                // 32-bit: where its moments start in the unit's small moments
    std::vector<std::pair<int64_t, int64_t>> shared;     // (block, exchange slot) of straddling blocks it touches
  };
  struct UnitState {
    std::vector<Span> spans;
    at::Tensor codes[2];   // uint8 [S]: like the shard (small params' and padding's places unused)
    at::Tensor absmax[2];  // fp32 [sum of the 8-bit spans' blocks]
    at::Tensor small[2];   // fp32 [sum of the 32-bit spans' numel]
  };
  // A straddling block's part on this rank, updated and waiting for its absmax.
  struct PendingBlock {
    size_t unit, span;
    int64_t block, slot, begin, end;  // elements [begin, end) of the param
    std::vector<float> values[2];
  };
  const Span& find(size_t i, const std::string& name) const;
  // Span s of unit i.
  void update_8bit(size_t i, size_t s, double lr, std::vector<float>& exchange, std::vector<PendingBlock>& pending);
  void update_32bit(size_t i, const Span& span, double lr);

  std::vector<at::Tensor> params_, grads_;
  std::vector<UnitState> units_;
  int64_t exchange_slots_ = 0;  // straddling blocks over every param (the same on every rank)
  AdamW8bitOptions options_;
  AllReduceMax all_reduce_max_;
};

}  // namespace mmtrain
