// DeviceMesh: the ranks of a run as a 4-D grid (dp_replicate, dp_shard, ring, ulysses), the
// Ulysses dimension fastest so that a Ulysses group is consecutive ranks (one node):
//   rank = ((replicate * dp_shard + shard) * ring + ring_rank) * ulysses + ulysses_rank
// and the groups each rank needs, every one its own c10d backend (Gloo / NCCL) over a prefixed
// store: no collective is written by hand.
//
//   fsdp        dp_shard x ring x ulysses   FSDP shards parameters over it: context-parallel
//                                           ranks hold different shards of the same model
//   replicate   dp_replicate                HSDP: the shard group's grads are all-reduced here
//   cp          ring x ulysses              the ranks that share one sample stream
//   ring, ulysses                           the two context-parallel algorithms' groups
// Data parallelism (ranks that see different samples) is dp_replicate x dp_shard; dp_rank()
// says which stream a rank reads. Reference: docs/parallelism.md.
#pragma once
#include "dist/comm.h"
#include "dist/runtime.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace mmtrain {

struct MeshShape {
  int dp_replicate = 1;
  int dp_shard = 1;
  int ring = 1;
  int ulysses = 1;
  int world() const { return dp_replicate * dp_shard * ring * ulysses; }
  int cp() const { return ring * ulysses; }
  int fsdp() const { return dp_shard * cp(); }
  int dp() const { return dp_replicate * dp_shard; }
  // Which sample stream (0..dp()-1) a rank of this mesh reads: replicate * dp_shard + shard.
  int dp_rank_of(int rank) const;
};

class DeviceMesh {
 public:
  // Every rank of world calls this with the same shape (world->world_size() == shape.world()), in
  // the same order relative to other collectives; store is the rendezvous store of world (may be
  // null when the world is one rank).
  DeviceMesh(MeshShape shape, std::shared_ptr<Comm> world, c10::intrusive_ptr<c10d::Store> store, Device device,
             std::chrono::milliseconds timeout = std::chrono::minutes(10));
  // One rank, no communication: every group is that rank alone.
  static DeviceMesh single(std::shared_ptr<Comm> world);

  const MeshShape& shape() const { return shape_; }
  int rank() const { return world_->rank(); }
  int replicate_rank() const { return replicate_rank_; }
  int shard_rank() const { return shard_rank_; }
  int ring_rank() const { return ring_rank_; }
  int ulysses_rank() const { return ulysses_rank_; }
  int dp_rank() const { return shape_.dp_rank_of(rank()); }
  int dp_size() const { return shape_.dp(); }

  const std::shared_ptr<Comm>& world() const { return world_; }
  const std::shared_ptr<Comm>& fsdp() const { return fsdp_; }
  const std::shared_ptr<Comm>& replicate() const { return replicate_; }
  const std::shared_ptr<Comm>& cp() const { return cp_; }
  const std::shared_ptr<Comm>& ring() const { return ring_; }
  const std::shared_ptr<Comm>& ulysses() const { return ulysses_; }

  // "dp_replicate 2 x dp_shard 1 x ring 2 x ulysses 1", for logs.
  std::string describe() const;

 private:
  DeviceMesh() = default;

  MeshShape shape_;
  int replicate_rank_ = 0, shard_rank_ = 0, ring_rank_ = 0, ulysses_rank_ = 0;
  std::shared_ptr<Comm> world_, fsdp_, replicate_, cp_, ring_, ulysses_;
};

}  // namespace mmtrain
