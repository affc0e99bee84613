// Thread-per-rank harness for multi-rank unit tests: W threads, one in-process HashStore, one
// Gloo backend per thread. No ports, no processes.
#pragma once
#include "dist/comm.h"
#include "dist/device_mesh.h"
#include "fsdp/fully_shard.h"

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace mmtrain::testing {

// Runs fn(comm) on world_size threads; rethrows the first failure on the caller's thread.
void run_ranks(int world_size, const std::function<void(Comm&)>& fn);
// Runs fn(mesh) on shape.world() threads, each with its DeviceMesh over one HashStore.
void run_mesh_ranks(const MeshShape& shape, const std::function<void(const DeviceMesh&)>& fn);

// Copies this rank's rows of every FSDP param into full[name] (zeros of the full shape on first
// use). Every rank calling it, one at a time, assembles the full params of the run.
void add_shard_rows(Fsdp& fsdp, int rank, std::map<std::string, at::Tensor>& full);

}  // namespace mmtrain::testing
