// Comm: the collectives the engine uses, over one c10d backend (Gloo on CPU, NCCL on CUDA).
//
// Async contract: every op returns a CommWork; the tensors passed in must not be read or
// written until wait() returns (Gloo runs ops on worker threads, NCCL on its own stream).
// Ops must be issued in the same order on every rank. Averages are SUM then divide: Gloo has
// no AVG. World size 1 needs no backend: ops become local copies.
#pragma once
#include "core/tensor_pool.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <vector>

namespace mmtrain {

class CommWork {
 public:
  CommWork() = default;
  CommWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> on_complete)
      : work_(std::move(work)), on_complete_(std::move(on_complete)) {}
  // Blocks until the op is complete and its output written; idempotent.
  void wait();
  bool pending() const { return work_ || on_complete_; }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> on_complete_;  // runs after work_ finished: copy-out, local reduction
};

class Comm {
 public:
  // backend may be null only when world_size == 1. device: where collective tensors live (NCCL
  // needs CUDA tensors; the scalar helpers below allocate there).
  Comm(c10::intrusive_ptr<c10d::Backend> backend, int rank, int world_size, at::Device device = at::kCPU);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  at::Device device() const { return device_; }
  const c10::intrusive_ptr<c10d::Backend>& backend() const { return backend_; }

  // out [W * n] <- concat over ranks of in [n] (rank order). Same dtype.
  CommWork all_gather_into(at::Tensor out, at::Tensor in);
  // One all-gather for several tensors (one FSDP unit): outs[i] [W * n_i] <- ins[i] [n_i].
  CommWork all_gather_into_coalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins);
  // out [n] <- sum over ranks of in[rank*n : (rank+1)*n], in is [W * n]. Same dtype. Native on
  // NCCL; on Gloo an all-to-all plus a local sum in rank order, which moves (W-1)/W of the data
  // like a real reduce-scatter (Gloo's own fallback all-reduces everything: twice the traffic).
  // scratch: where the Gloo path takes its receive buffer [W * n] from and gives it back to on
  // completion (its owner must take and give on the thread that calls wait()); null: allocated.
  CommWork reduce_scatter_sum(at::Tensor out, at::Tensor in, TensorPool* scratch = nullptr);
  CommWork all_reduce_sum(at::Tensor t);
  CommWork all_reduce_max(at::Tensor t);
  // Equal splits: in [W * n] -> out [W * n], block i of in goes to rank i.
  CommWork all_to_all(at::Tensor out, at::Tensor in);
  CommWork broadcast(at::Tensor t, int root);
  CommWork send(at::Tensor t, int dst_rank, int tag);
  CommWork recv(at::Tensor t, int src_rank, int tag);
  void barrier();

  // Collectives (and sends/receives) issued so far on a backend, for tests that check who
  // communicates; a world of one issues none.
  int64_t collectives_issued() const { return issued_.load(); }

  // Convenience: blocking sum of a double across ranks (metrics, grad norms).
  double all_reduce_sum(double value);
  // Blocking sum / max of a few doubles across ranks (one collective for all of them).
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  std::vector<double> all_reduce_max(const std::vector<double>& values);

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_ = 0;
  int world_size_ = 1;
  at::Device device_ = at::kCPU;
  bool native_reduce_scatter_ = false;
  std::atomic<int64_t> issued_{0};
};

}  // namespace mmtrain
