#include "multirank_harness.h"

#include "dist/runtime.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <exception>
#include <mutex>
#include <thread>

namespace mmtrain::testing {

namespace {

// fn(comm, store) on world_size threads, one Gloo backend per thread over one HashStore.
void run_threads(int world_size, const std::function<void(std::shared_ptr<Comm>, c10::intrusive_ptr<c10d::Store>)>& fn) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> threads;
  std::exception_ptr first_error;
  std::mutex error_mutex;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        c10::intrusive_ptr<c10d::Backend> backend;
        if (world_size > 1)
          backend = make_backend(store, rank, world_size, Device::cpu, std::chrono::seconds(60));
        fn(std::make_shared<Comm>(backend, rank, world_size), store);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace

void run_ranks(int world_size, const std::function<void(Comm&)>& fn) {
  run_threads(world_size, [&](std::shared_ptr<Comm> comm, c10::intrusive_ptr<c10d::Store>) { fn(*comm); });
}

void run_mesh_ranks(const MeshShape& shape, const std::function<void(const DeviceMesh&)>& fn) {
  run_threads(shape.world(), [&](std::shared_ptr<Comm> comm, c10::intrusive_ptr<c10d::Store> store) {
    if (shape.world() == 1) return fn(DeviceMesh::single(comm));
    fn(DeviceMesh(shape, comm, store, Device::cpu, std::chrono::seconds(60)));
  });
}

void add_shard_rows(Fsdp& fsdp, int rank, std::map<std::string, at::Tensor>& full) {
  for (auto* unit : fsdp.units())
    for (auto& p : unit->params) {
      auto& param = full[p.name];
      if (!param.defined()) param = at::zeros(p.param->shape);
      const int64_t rows = p.layout.rows(rank);
      if (rows > 0) param.narrow(0, p.layout.row_begin(rank), rows).copy_(p.shard.narrow(0, 0, rows));
    }
}

}  // namespace mmtrain::testing
