#include "dist/device_mesh.h"

#include "core/error.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <functional>
#include <vector>

namespace mmtrain {
namespace {

// Coordinates (replicate, shard, ring, ulysses) of a rank, and back.
struct Coords {
  int replicate, shard, ring, ulysses;
};
Coords coords_of(const MeshShape& m, int rank) {
  Coords c;
  c.ulysses = rank % m.ulysses;
  c.ring = (rank / m.ulysses) % m.ring;
  c.shard = (rank / (m.ulysses * m.ring)) % m.dp_shard;
  c.replicate = rank / (m.ulysses * m.ring * m.dp_shard);
  return c;
}
int rank_of(const MeshShape& m, const Coords& c) {
  return ((c.replicate * m.dp_shard + c.shard) * m.ring + c.ring) * m.ulysses + c.ulysses;
}

}  // namespace

int MeshShape::dp_rank_of(int rank) const {
  const Coords c = coords_of(*this, rank);
  return c.replicate * dp_shard + c.shard;
}

DeviceMesh::DeviceMesh(MeshShape shape, std::shared_ptr<Comm> world, c10::intrusive_ptr<c10d::Store> store,
                       Device device, std::chrono::milliseconds timeout)
    : shape_(shape), world_(std::move(world)) {
  if (shape_.dp_replicate < 1 || shape_.dp_shard < 1 || shape_.ring < 1 || shape_.ulysses < 1)
    fail("device mesh: every dimension must be >= 1, got ", describe());
  if (shape_.world() != world_->world_size())
    fail("device mesh: ", describe(), " is ", shape_.world(), " ranks, the world has ", world_->world_size());
  const Coords me = coords_of(shape_, world_->rank());
  replicate_rank_ = me.replicate;
  shard_rank_ = me.shard;
  ring_rank_ = me.ring;
  ulysses_rank_ = me.ulysses;

  // One group: the ranks whose coordinates differ from mine only where `varies` says. Groups are
  // built in a fixed order on every rank, so each rendezvous finds all of its members.
  const at::Device comm_device = world_->device();
  auto group = [&](const std::string& name, const std::function<bool(const Coords&)>& member) {
    std::vector<int> ranks;
    for (int r = 0; r < shape_.world(); ++r)
      if (member(coords_of(shape_, r))) ranks.push_back(r);
    const int size = static_cast<int>(ranks.size());
    int my_index = 0;
    while (ranks[my_index] != world_->rank()) ++my_index;
    if (size == 1) return std::make_shared<Comm>(nullptr, 0, 1, comm_device);
    // Plain FSDP shards over the world's own group; every other group gets a backend of its own,
    // even at the world's size, so that each dimension's traffic stays apart.
    if (name == "fsdp" && size == shape_.world()) return world_;
    if (!store) fail("device mesh: group ", name, " needs a store");
    const std::string prefix = "mesh/" + name + "/" + std::to_string(ranks.front());
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    return std::make_shared<Comm>(make_backend(prefixed, my_index, size, device, timeout), my_index, size, comm_device);
  };
  fsdp_ = group("fsdp", [&](const Coords& c) { return c.replicate == me.replicate; });
  replicate_ = group("replicate", [&](const Coords& c) {
    return c.shard == me.shard && c.ring == me.ring && c.ulysses == me.ulysses;
  });
  cp_ = group("cp", [&](const Coords& c) { return c.replicate == me.replicate && c.shard == me.shard; });
  ring_ = group("ring", [&](const Coords& c) {
    return c.replicate == me.replicate && c.shard == me.shard && c.ulysses == me.ulysses;
  });
  ulysses_ = group("ulysses", [&](const Coords& c) {
    return c.replicate == me.replicate && c.shard == me.shard && c.ring == me.ring;
  });
  // Group ranks follow world order, so a rank's index in its groups is its coordinate.
  if (fsdp_->rank() != (me.shard * shape_.ring + me.ring) * shape_.ulysses + me.ulysses || ring_->rank() != me.ring ||
      ulysses_->rank() != me.ulysses || cp_->rank() != me.ring * shape_.ulysses + me.ulysses ||
      replicate_->rank() != me.replicate || rank_of(shape_, me) != world_->rank())
    fail("device mesh: group ranks disagree with the mesh coordinates (internal error)");
}

DeviceMesh DeviceMesh::single(std::shared_ptr<Comm> world) {
  if (world->world_size() != 1) fail("DeviceMesh::single: the world has ", world->world_size(), " ranks");
  DeviceMesh mesh;
  mesh.world_ = world;
  mesh.fsdp_ = mesh.replicate_ = mesh.cp_ = mesh.ring_ = mesh.ulysses_ = world;
  return mesh;
}

std::string DeviceMesh::describe() const {
  return "dp_replicate " + std::to_string(shape_.dp_replicate) + " x dp_shard " + std::to_string(shape_.dp_shard) +
         " x ring " + std::to_string(shape_.ring) + " x ulysses " + std::to_string(shape_.ulysses);
}

}  // namespace mmtrain
