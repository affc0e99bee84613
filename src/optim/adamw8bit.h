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
//
// On the disk tier (training.offload_dir) each unit's state is one region of the rank's DiskStore
// file and is in RAM only around its update: unit i+1's is read while unit i updates, unit i's
// written back right after; the straddling blocks are then settled unit by unit (one all-reduce
// per unit that has any) so that no unit has to come back. A checkpoint reaches a paged unit
// through keep_resident().
#pragma once
#include "offload/disk_store.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "quant/dynamic_map.h"

#include <ATen/ATen.h>

#include <functional>
#include <future>
#include <memory>
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
  // disk: the state lives there (above), never all of it in memory; null: in memory (allocate's).
  AdamW8bit(std::vector<at::Tensor> params, std::vector<at::Tensor> grads, std::vector<std::vector<ShardedParamSpan>> spans,
            int rank, AdamW8bitOptions options, AllReduceMax all_reduce_max, StateAllocator allocate = nullptr,
            std::shared_ptr<DiskStore> disk = nullptr);
  ~AdamW8bit() override;  // waits for a read still on its way into a unit's buffer

  void step(double lr) override;
  // Memory the state holds where the update runs: all of it, or on the disk tier the two units'
  // buffers (the one updating, the one read ahead).
  int64_t state_bytes() const override;
  // On the disk tier: the state in RAM for the largest unit (what state_bytes() counts twice).
  int64_t largest_unit_state_bytes() const;
  int64_t total_state_bytes() const;  // every unit's, wherever it is
  const DiskStore* disk() const { return disk_.get(); }
  double disk_wait_ms() const { return disk_wait_ms_; }  // total time blocked on the disk tier's transfers

  // On the disk tier, the accessors below need unit i's state in RAM: this brings it in (writing
  // back and dropping the unit held before; `changing`: the caller will overwrite it, so it is
  // written back when let go). The views handed out keep their bytes after that. release() lets
  // the held unit go. In memory: nothing to do.
  void keep_resident(size_t i, bool changing) const;
  void release() const;
  int64_t min_8bit_size() const { return options_.min_8bit_size; }
  // What state_bytes() will be on `rank` for these spans over flat shards of shard_numel elements
  // in all (the planner's figure): 2 bytes of codes per shard element, 8 per touched block's two
  // absmax, 8 per element of a param below min_8bit_size.
  static int64_t state_bytes_for(int64_t shard_numel, const std::vector<ShardedParamSpan>& spans, int rank,
                                 int64_t min_8bit_size);

  // The planner's figure for one unit's state in RAM on the disk tier (largest_unit_state_bytes):
  // 2 bytes of codes a shard element and two absmax per 256 of them. Each param rounds its blocks
  // up and small params keep 8 bytes an element, which adds a few KiB a unit at the real models'
  // sizes (their norms and biases).
  static int64_t unit_state_bytes_estimate(int64_t shard_numel) { return 2 * shard_numel + 8 * (blocks_of(shard_numel) + 1); }

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
  // A unit's state is one fp32 buffer (`memory`, fp32 [floats()]) that the tensors view:
  // absmax[0], absmax[1], small[0], small[1], then the codes' bytes (codes[0], codes[1]).
  struct UnitState {
    std::vector<Span> spans;
    int64_t shard_numel = 0, absmax_numel = 0, small_numel = 0;
    at::Tensor memory;     // undefined while on disk
    at::Tensor codes[2];   // uint8 [S]: like the shard (small params' and padding's places unused)
    at::Tensor absmax[2];  // fp32 [sum of the 8-bit spans' blocks]
    at::Tensor small[2];   // fp32 [sum of the 32-bit spans' numel]
    // Disk tier: the unit's region, its read under way (into `incoming`), whether it is to be
    // written back.
    int64_t disk_offset = 0;
    at::Tensor incoming;
    std::shared_future<void> arriving;
    bool changed = false;
    int64_t slot_begin = 0, slot_end = 0;  // its straddling blocks' exchange slots

    int64_t floats() const { return 2 * absmax_numel + 2 * small_numel + (2 * shard_numel + 3) / 4; }
    int64_t bytes() const { return 2 * (shard_numel + 4 * absmax_numel + 4 * small_numel); }  // the tensors'
    void bind(at::Tensor memory);  // makes the tensors views of it
  };
  // A straddling block's part on this rank, updated and waiting for its absmax.
  struct PendingBlock {
    size_t unit, span;
    int64_t block, slot, begin, end;  // elements [begin, end) of the param
    std::vector<float> values[2];
  };
  const Span& find(size_t i, const std::string& name) const;
  const Span& find_resident(size_t i, const std::string& name) const;  // and its state in RAM, or fails
  // Disk tier: the read of unit i's state starts (nothing if it is in RAM or coming); page_in
  // waits for it; page_out writes it back when changed and drops it.
  void read_ahead(size_t i) const;
  void page_in(size_t i) const;
  void page_out(size_t i) const;
  void wait_for_disk(const std::shared_future<void>& transfer) const;  // and count the time
  // The absmax of the straddling blocks in pending whose slots are in [slot_begin, slot_end), over
  // the ranks, then their codes; exchange holds this rank's maxima by slot.
  void settle(std::vector<PendingBlock>& pending, std::vector<float>& exchange, int64_t slot_begin, int64_t slot_end);
  // Span s of unit i.
  void update_8bit(size_t i, size_t s, double lr, std::vector<float>& exchange, std::vector<PendingBlock>& pending);
  void update_32bit(size_t i, const Span& span, double lr);

  std::vector<at::Tensor> params_, grads_;
  mutable std::vector<UnitState> units_;  // mutable: paging a unit in for a const reader
  std::shared_ptr<DiskStore> disk_;
  mutable std::optional<size_t> held_;  // the unit keep_resident brought in
  mutable double disk_wait_ms_ = 0;
  int64_t exchange_slots_ = 0;  // straddling blocks over every param (the same on every rank)
  AdamW8bitOptions options_;
  AllReduceMax all_reduce_max_;
};

}  // namespace mmtrain
