#include "dist/comm.h"

#include "core/error.h"

namespace mmtrain {

void CommWork::wait() {
  if (work_) {
    work_->wait();
    work_.reset();
  }
  if (on_complete_) {
    auto finish = std::move(on_complete_);
    on_complete_ = nullptr;
    finish();
  }
}

Comm::Comm(c10::intrusive_ptr<c10d::Backend> backend, int rank, int world_size, at::Device device)
    : backend_(std::move(backend)), rank_(rank), world_size_(world_size), device_(device) {
  if (world_size_ > 1 && !backend_) fail("Comm: world size ", world_size_, " needs a backend");
  native_reduce_scatter_ = backend_ && backend_->getBackendName() == "nccl";
}

CommWork Comm::all_gather_into(at::Tensor out, at::Tensor in) {
  TORCH_CHECK(out.numel() == in.numel() * world_size_, "all_gather_into: out has ", out.numel(),
              " elements, expected ", in.numel() * world_size_);
  if (world_size_ == 1) {
    out.view(-1).copy_(in.view(-1));
    return {};
  }
  ++issued_;
  return CommWork(backend_->_allgather_base(out, in), [out, in] {});
}

CommWork Comm::all_gather_into_coalesced(std::vector<at::Tensor> outs,
                                         std::vector<at::Tensor> ins) {
  TORCH_CHECK(outs.size() == ins.size(), "all_gather_into_coalesced: ", outs.size(), " outputs for ",
              ins.size(), " inputs");
  for (size_t i = 0; i < outs.size(); ++i)
    TORCH_CHECK(outs[i].numel() == ins[i].numel() * world_size_, "all_gather_into_coalesced: out ",
                i, " has ", outs[i].numel(), " elements, expected ", ins[i].numel() * world_size_);
  if (world_size_ == 1) {
    for (size_t i = 0; i < outs.size(); ++i) outs[i].view(-1).copy_(ins[i].view(-1));
    return {};
  }
  ++issued_;
  auto work = backend_->allgather_into_tensor_coalesced(outs, ins);
  return CommWork(work, [outs, ins] {});
}

CommWork Comm::reduce_scatter_sum(at::Tensor out, at::Tensor in, TensorPool* scratch) {
  TORCH_CHECK(in.numel() == out.numel() * world_size_, "reduce_scatter_sum: in has ", in.numel(),
              " elements, expected ", out.numel() * world_size_);
  if (world_size_ == 1) {
    out.view(-1).copy_(in.view(-1));
    return {};
  }
  ++issued_;
  if (native_reduce_scatter_) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    return CommWork(backend_->_reduce_scatter_base(out, in, opts), [out, in] {});
  }
  auto received = scratch ? scratch->take({world_size_, out.numel()}, in.options())
                          : at::empty({world_size_, out.numel()}, in.options());
  std::vector<int64_t> splits(world_size_, out.numel());
  auto in_flat = in.view(-1);
  auto received_flat = received.view(-1);
  auto work = backend_->alltoall_base(received_flat, in_flat, splits, splits);
  return CommWork(work, [out, in, received, scratch]() mutable {
    // Sum in rank order so every rank's result is bitwise deterministic; the first two rows in
    // one pass.
    auto out_flat = out.view(-1);
    at::add_out(out_flat, received[0], received[1]);
    for (int64_t r = 2; r < received.size(0); ++r) out_flat.add_(received[r]);
    if (scratch) scratch->give(std::move(received));
  });
}

CommWork Comm::all_reduce_sum(at::Tensor t) {
  if (world_size_ == 1) return {};
  ++issued_;
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  return CommWork(backend_->allreduce(tensors, opts), [t] {});
}

CommWork Comm::all_reduce_max(at::Tensor t) {
  if (world_size_ == 1) return {};
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
  if (world_size_ == 1) {
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
  if (world_size_ == 1) return {};
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
  if (world_size_ == 1) return;
  ++issued_;
  backend_->barrier()->wait();
}

double Comm::all_reduce_sum(double value) { return all_reduce_sum(std::vector<double>{value})[0]; }

static std::vector<double> reduce_doubles(Comm& comm, const std::vector<double>& values, bool max) {
  if (comm.world_size() == 1) return values;
  auto t = at::tensor(values, at::kDouble).to(comm.device());
  (max ? comm.all_reduce_max(t) : comm.all_reduce_sum(t)).wait();
  t = t.cpu();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::vector<double> Comm::all_reduce_sum(const std::vector<double>& values) { return reduce_doubles(*this, values, false); }

std::vector<double> Comm::all_reduce_max(const std::vector<double>& values) { return reduce_doubles(*this, values, true); }

}  // namespace mmtrain
