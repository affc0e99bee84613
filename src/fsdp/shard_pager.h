// fsdp_plan.cpu_offload with training.offload_dir: the units' fp32 shards live on the disk tier
// (ZeRO-Infinity's parameter tier) and come into host RAM only while they are used: a unit's
// shard is read ahead while the unit before it computes, installed just before its all-gather
// copies it to the device and let go right after, and during the optimizer step each unit is read
// ahead while the one before it updates and written back after its own update.
//
// How: unit.shard_flat (and the per-param views into it) keep their TensorImpls; paging out hands
// the storage's memory back to the host pool (storage size 0, as FSDP's gather buffers do), paging
// in reads the unit's region of the rank's DiskStore file into a pool buffer and gives it to the
// storage again, so every view sees the bytes. Nothing outside the pager may touch a paged-out
// shard: the FSDP engine pages around its gathers and its loads, AdamW around each unit's update,
// and a checkpoint save around each unit's tensors (train/state.cpp): one unit in RAM at a time.
#pragma once
#include "fsdp/fully_shard.h"
#include "offload/offload_tiers.h"

#include <future>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

class ShardPager {
 public:
  // Reserves each unit's region in tiers.disk (buffers from tiers.host_pool, waits counted in
  // tiers.stats); the shards stay resident until page_out_all().
  ShardPager(std::shared_ptr<OffloadTiers> tiers, const std::vector<FsdpUnit*>& units);
  ~ShardPager();  // waits for reads still on their way into the pages' buffers
  ShardPager(const ShardPager&) = delete;
  ShardPager& operator=(const ShardPager&) = delete;

  // Starts reading the unit's shard into a pool buffer in the background, so that the page_in
  // that follows waits only for what is left of the read (the engine reads one unit ahead of its
  // gathers, AdamW one ahead of its updates); nothing when it is resident or on its way.
  void read_ahead(FsdpUnit& unit);
  void page_in(FsdpUnit& unit);                // reads it (waits); nothing when resident
  // page_in, then read_ahead of the unit after it: how a walk over the units in order (the
  // optimizer step, the EMA, a checkpoint save) keeps the next one coming.
  void page_in_reading_next(FsdpUnit& unit);
  void page_out(FsdpUnit& unit, bool changed);  // writes it when changed, frees its RAM; a failed
                                                // write throws (file, offset, errno), the shard stays
  void page_out_all(bool changed);
  bool resident(const FsdpUnit& unit) const;

 private:
  struct Page {
    FsdpUnit* unit;
    int64_t offset;     // the unit's region in the file
    bool resident = true;
    at::Tensor incoming;                  // read_ahead's pool buffer, until page_in installs it
    std::shared_future<void> arriving;    // its read
  };
  Page& page_of(const FsdpUnit& unit);
  const Page& page_of(const FsdpUnit& unit) const;

  void wait(const std::shared_future<void>& transfer);  // and count the time in the stats

  std::shared_ptr<OffloadTiers> tiers_;
  std::vector<Page> pages_;  // by unit order
};

}  // namespace mmtrain
