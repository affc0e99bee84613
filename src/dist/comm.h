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
      : works_{std::move(work)}, on_complete_(std::move(on_complete)) {}
  // An op made of several backend ops (the sends and receives of a point-to-point collective).
  CommWork(std::vector<c10::intrusive_ptr<c10d::Work>> works, std::function<void()> on_complete)
      : works_(std::move(works)), on_complete_(std::move(on_complete)) {}
  // Blocks until the op is complete and its output written; idempotent.
  void wait();
  bool pending() const { return !works_.empty() || on_complete_; }

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;
  std::function<void()> on_complete_;  // runs after works_ finished: copy-out, local reduction
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
  // One rank and no NCCL: every collective returns at once (see local_only_).
  bool local_only() const { return local_only_; }

  // In-place all-gather of several tensors (one FSDP unit's params): outs[i] is [W * n_i], and
  // its block [rank * n_i, (rank + 1) * n_i) already holds this rank's data; afterwards block r
  // holds rank r's. On Gloo every block travels point to point from its place on the sender
  // straight into its place on each receiver: Gloo's coalesced all-gather would flatten the
  // inputs, gather into a staging buffer and copy out, three more passes over the unit on the
  // cores that compute. NCCL: one coalesced all-gather.
  CommWork all_gather_in_place(std::vector<at::Tensor> outs);
  // Reduce-scatter of several tensors: outs[i] [n_i] <- the sum over ranks r, in rank order, of
  // rank r's blocks[i][rank()]. blocks[i] holds W contiguous [n_i] tensors, the one at index q
  // for rank q: views into the grads themselves need no packing. Same dtype throughout. Gloo:
  // point to point (moving (W-1)/W of the data, like a real reduce-scatter) plus a local sum, so
  // every rank's result is bitwise deterministic; NCCL: packed into one [W, sum n_i] buffer for
  // one native reduce-scatter. scratch: where the receive (Gloo) or pack (NCCL) buffers are taken
  // from and given back to on completion (its owner must take and give on the thread that calls
  // wait()); null: allocated.
  CommWork reduce_scatter_sum_blocks(std::vector<at::Tensor> outs, std::vector<std::vector<at::Tensor>> blocks,
                                     TensorPool* scratch = nullptr);
  CommWork all_reduce_sum(at::Tensor t);
  CommWork all_reduce_max(at::Tensor t);
  // Equal splits: in [W * n] -> out [W * n], block i of in goes to rank i.
  CommWork all_to_all(at::Tensor out, at::Tensor in);
  CommWork broadcast(at::Tensor t, int root);
  CommWork send(at::Tensor t, int dst_rank, int tag);
  CommWork recv(at::Tensor t, int src_rank, int tag);
  void barrier();

  // Collectives (and sends/receives) issued so far on a backend, for tests that check who
  // communicates; a world of one issues none (unless its backend is NCCL: see local_only_).
  int64_t collectives_issued() const { return issued_.load(); }

  // Convenience: blocking sum of a double across ranks (metrics, grad norms).
  double all_reduce_sum(double value);
  // Blocking sum / max of a few doubles across ranks (one collective for all of them).
  std::vector<double> all_reduce_sum(const std::vector<double>& values);
  std::vector<double> all_reduce_max(const std::vector<double>& values);
  // True on every rank when `local` is true on any rank: how ranks agree to stop together (one
  // collective; every rank must call it).
  bool any_rank(bool local);

 private:
  c10::intrusive_ptr<c10d::Backend> backend_;
  int rank_ = 0;
  int world_size_ = 1;
  at::Device device_ = at::kCPU;
  // The first of `count` consecutive tags for the messages of one point-to-point collective.
  // Every rank issues the same collectives in the same order, so tags match across ranks; they
  // start above the small tags callers of send/recv use and cycle long before overflow.
  int take_tags(int count);

  bool native_collectives_ = false;  // NCCL: coalesced and reduce-scatter ops are native
  bool local_only_ = true;           // one rank and no NCCL: collectives return at once
  std::atomic<int64_t> issued_{0};
  int next_tag_ = kFirstCollectiveTag;
  static constexpr int kFirstCollectiveTag = 1 << 20, kLastCollectiveTag = 1 << 30;
};

}  // namespace mmtrain
