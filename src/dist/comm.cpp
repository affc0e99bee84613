#include "dist/comm.h"

#include "core/error.h"

#include <utility>

namespace mmtrain {

void CommWork::wait() {
  for (auto& work : works_) work->wait();
  works_.clear();
  if (on_complete_) {
    auto finish = std::move(on_complete_);
    on_complete_ = nullptr;
    finish();
  }
}

Comm::Comm(c10::intrusive_ptr<c10d::Backend> backend, int rank, int world_size, at::Device device)
    : backend_(std::move(backend)), rank_(rank), world_size_(world_size), device_(device) {
  if (world_size_ > 1 && !backend_) fail("Comm: world size ", world_size_, " needs a backend");
  native_collectives_ = backend_ && backend_->getBackendName() == "nccl";
  // A world of one has nothing to exchange, except through NCCL, whose collectives run even for
  // one rank: how a one-GPU machine checks the NCCL path (scripts/gpu_check.sh).
  local_only_ = world_size_ == 1 && !native_collectives_;
}

int Comm::take_tags(int count) {
  if (next_tag_ + count > kLastCollectiveTag) next_tag_ = kFirstCollectiveTag;
  return std::exchange(next_tag_, next_tag_ + count);
}

CommWork Comm::all_gather_in_place(std::vector<at::Tensor> outs) {
  for (size_t i = 0; i < outs.size(); ++i)
    TORCH_CHECK(outs[i].is_contiguous() && outs[i].numel() % world_size_ == 0, "all_gather_in_place: out ", i,
                " must be contiguous with a multiple of ", world_size_, " elements, has ", outs[i].numel());
  if (local_only_) return {};
  ++issued_;
  auto block = [this](const at::Tensor& out, int r) {
    const int64_t n = out.numel() / world_size_;
    return out.view(-1).narrow(0, r * n, n);
  };
  if (native_collectives_) {
    std::vector<at::Tensor> ins;
    for (auto& out : outs) ins.push_back(block(out, rank_));
    return CommWork(backend_->allgather_into_tensor_coalesced(outs, ins), [outs, ins] {});
  }
  const int first_tag = take_tags(static_cast<int>(outs.size()));
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int peer = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<at::Tensor> mine{block(outs[i], rank_)}, theirs{block(outs[i], peer)};
      works.push_back(backend_->send(mine, peer, first_tag + static_cast<int>(i)));
      works.push_back(backend_->recv(theirs, peer, first_tag + static_cast<int>(i)));
    }
  }
  return CommWork(std::move(works), [outs] {});
}

CommWork Comm::reduce_scatter_sum_blocks(std::vector<at::Tensor> outs, std::vector<std::vector<at::Tensor>> blocks,
                                         TensorPool* scratch) {
  TORCH_CHECK(outs.size() == blocks.size(), "reduce_scatter_sum_blocks: ", outs.size(), " outputs for ",
              blocks.size(), " inputs");
  int64_t total = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    TORCH_CHECK(blocks[i].size() == static_cast<size_t>(world_size_), "reduce_scatter_sum_blocks: input ", i, " has ",
                blocks[i].size(), " blocks, expected ", world_size_);
    for (auto& b : blocks[i])
      TORCH_CHECK(b.is_contiguous() && b.numel() == outs[i].numel() && b.scalar_type() == outs[i].scalar_type(),
                  "reduce_scatter_sum_blocks: input ", i, " needs contiguous blocks of ", outs[i].numel(), " ",
                  outs[i].scalar_type(), " elements");
    total += outs[i].numel();
  }
  if (local_only_) {
    for (size_t i = 0; i < outs.size(); ++i) outs[i].view(-1).copy_(blocks[i][0].view(-1));
    return {};
  }
  ++issued_;
  if (outs.empty()) return {};
  const auto options = outs[0].options();
  auto take = [&](at::IntArrayRef shape) { return scratch ? scratch->take(shape, options) : at::empty(shape, options); };
  if (native_collectives_) {
    // Row r of the pack is what goes to rank r: every input's block r, one after another.
    auto packed = take({world_size_, total});
    auto reduced = take({total});
    for (int r = 0; r < world_size_; ++r) {
      int64_t offset = 0;
      for (size_t i = 0; i < outs.size(); ++i) {
        packed[r].narrow(0, offset, outs[i].numel()).copy_(blocks[i][r].view(-1));
        offset += outs[i].numel();
      }
    }
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    auto work = backend_->_reduce_scatter_base(reduced, packed, opts);
    return CommWork(work, [outs, packed, reduced, scratch]() mutable {
      int64_t offset = 0;
      for (auto& out : outs) {
        out.view(-1).copy_(reduced.narrow(0, offset, out.numel()));
        offset += out.numel();
      }
      if (scratch) {
        scratch->give(std::move(packed));
        scratch->give(std::move(reduced));
      }
    });
  }
  // received[k]: what the k-th other rank (in rank order) sent for this rank's blocks.
  auto received = take({world_size_ - 1, total});
  const int first_tag = take_tags(static_cast<int>(outs.size()));
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  for (int peer = 0, k = 0; peer < world_size_; ++peer) {
    if (peer == rank_) continue;
    int64_t offset = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      std::vector<at::Tensor> mine{blocks[i][peer]}, theirs{received[k].narrow(0, offset, outs[i].numel())};
      works.push_back(backend_->send(mine, peer, first_tag + static_cast<int>(i)));
      works.push_back(backend_->recv(theirs, peer, first_tag + static_cast<int>(i)));
      offset += outs[i].numel();
    }
    ++k;
  }
  const int me = rank_, world = world_size_;
  return CommWork(std::move(works), [outs, blocks, received, scratch, me, world]() mutable {
    // Rank r's block of input i, in rank order, so the sum is the same on every rank.
    int64_t offset = 0;
    for (size_t i = 0; i < outs.size(); ++i) {
      const int64_t n = outs[i].numel();
      auto from = [&](int r) {
        return r == me ? blocks[i][me].view(-1) : received[r < me ? r : r - 1].narrow(0, offset, n);
      };
      auto out = outs[i].view(-1);
      at::add_out(out, from(0), from(1));
      for (int r = 2; r < world; ++r) out.add_(from(r));
      offset += n;
    }
    if (scratch) scratch->give(std::move(received));
  });
}

CommWork Comm::all_reduce_sum(at::Tensor t) {
  if (local_only_) return {};
  ++issued_;
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  return CommWork(backend_->allreduce(tensors, opts), [t] {});
}

CommWork Comm::all_reduce_max(at::Tensor t) {
  if (local_only_) return {};
  ++issued_;
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  return CommWork(backend_->allreduce(tensors, opts), [t] {});
}

CommWork Comm::all_to_all(at::Tensor out, at::Tensor in) {
  TORCH_CHECK(in.numel() == out.numel() && in.numel() % world_size_ == 0,
              "all_to_all: need equal sizes divisible by world size, got ", in.numel(), " and ",
              out.numel());
  if (local_only_) {
    out.copy_(in);
    return {};
  }
  ++issued_;
  std::vector<int64_t> splits(world_size_, in.numel() / world_size_);
  auto in_flat = in.view(-1);
  auto out_flat = out.view(-1);
  return CommWork(backend_->alltoall_base(out_flat, in_flat, splits, splits), [out, in] {});
}

CommWork Comm::broadcast(at::Tensor t, int root) {
  if (local_only_) return {};
  ++issued_;
  std::vector<at::Tensor> tensors{t};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  return CommWork(backend_->broadcast(tensors, opts), [t] {});
}

CommWork Comm::send(at::Tensor t, int dst_rank, int tag) {
  ++issued_;
  std::vector<at::Tensor> tensors{t};
  return CommWork(backend_->send(tensors, dst_rank, tag), [t] {});
}

CommWork Comm::recv(at::Tensor t, int src_rank, int tag) {
  ++issued_;
  std::vector<at::Tensor> tensors{t};
  return CommWork(backend_->recv(tensors, src_rank, tag), [t] {});
}

void Comm::barrier() {
  if (local_only_) return;
  ++issued_;
  backend_->barrier()->wait();
}

double Comm::all_reduce_sum(double value) { return all_reduce_sum(std::vector<double>{value})[0]; }

static std::vector<double> reduce_doubles(Comm& comm, const std::vector<double>& values, bool max) {
  if (comm.local_only()) return values;
  auto t = at::tensor(values, at::kDouble).to(comm.device());
  (max ? comm.all_reduce_max(t) : comm.all_reduce_sum(t)).wait();
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::vector<double> Comm::all_reduce_sum(const std::vector<double>& values) { return reduce_doubles(*this, values, false); }

std::vector<double> Comm::all_reduce_max(const std::vector<double>& values) { return reduce_doubles(*this, values, true); }

bool Comm::any_rank(bool local) { return all_reduce_max(std::vector<double>{local ? 1.0 : 0.0})[0] > 0; }

}  // namespace mmtrain
