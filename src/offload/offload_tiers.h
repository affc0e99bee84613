// The tiers one rank's offload features share: the pinned host pool, the side stream their
// device<->host copies run on, and the counters those copies and the disk tier add to. Built once
// by the trainer and handed to activation offload, fsdp cpu_offload and adamw_swap, so that one
// set of counters answers "what moved, and how long did the step wait" for metrics.jsonl.
#pragma once
#include "offload/copy_stream.h"
#include "offload/disk_store.h"
#include "offload/host_pool.h"
#include "offload/offload_stats.h"

#include <memory>

namespace mmtrain {

struct OffloadTiers {
  std::shared_ptr<OffloadStats> stats;
  std::shared_ptr<HostPool> host_pool;
  std::shared_ptr<CopyStream> copies;  // between the compute device and the host pool
  std::shared_ptr<DiskStore> disk;     // training.offload_dir: the rank's file; else null

  // device: where the model computes (kCPU: the copies run inline).
  static std::shared_ptr<OffloadTiers> make(at::Device device) {
    auto tiers = std::make_shared<OffloadTiers>();
    tiers->stats = std::make_shared<OffloadStats>();
    tiers->host_pool = std::make_shared<HostPool>(/*pinned=*/device.is_cuda());
    tiers->copies = std::make_shared<CopyStream>(device, tiers->stats, tiers->host_pool);
    return tiers;
  }
};

}  // namespace mmtrain
