#include "parallel/context_parallel.h"

#include "core/error.h"

#include <torch/csrc/autograd/custom_function.h>

#include <limits>
#include <optional>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct CommHolder : torch::CustomClassHolder {
  std::shared_ptr<Comm> comm;
  std::vector<std::vector<AttentionSegment>> segments;  // ring: per source ring rank
};

c10::IValue capsule(std::shared_ptr<Comm> comm, std::vector<std::vector<AttentionSegment>> segments = {}) {
  auto holder = c10::make_intrusive<CommHolder>();
  holder->comm = std::move(comm);
  holder->segments = std::move(segments);
  return c10::IValue::make_capsule(holder);
}
const CommHolder& holder_of(AutogradContext* ctx) {
  return *c10::static_intrusive_pointer_cast<CommHolder>(ctx->saved_data["comm"].toCapsule());
}

// [T_u, H, d] rows of this rank -> [U * T_u, H/U, d]: every Ulysses rank's rows for this rank's
// heads, in rank order. The inverse is `sequence_from_heads`.
at::Tensor heads_from_sequence(Comm& comm, const at::Tensor& x) {
  const int64_t u = comm.world_size(), rows = x.size(0), heads = x.size(1), d = x.size(2);
  auto send = x.reshape({rows, u, heads / u, d}).permute({1, 0, 2, 3}).contiguous();  // [U, T_u, H/U, d]
  auto received = at::empty_like(send);
  comm.all_to_all(received, send).wait();
  return received.view({u * rows, heads / u, d});
}
// [U * T_u, H/U, d] -> [T_u, H, d].
at::Tensor sequence_from_heads(Comm& comm, const at::Tensor& x) {
  const int64_t u = comm.world_size(), rows = x.size(0) / u, heads = x.size(1), d = x.size(2);
  auto send = x.reshape({u, rows, heads, d}).contiguous();
  auto received = at::empty_like(send);
  comm.all_to_all(received, send).wait();
  return received.permute({1, 0, 2, 3}).reshape({rows, u * heads, d});
}

// The two Ulysses all-to-alls as autograd Functions: each one's backward is the other.
struct UlyssesToHeads : torch::autograd::Function<UlyssesToHeads> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue comm) {
    ctx->saved_data["comm"] = comm;
    return heads_from_sequence(*holder_of(ctx).comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {sequence_from_heads(*holder_of(ctx).comm, grads[0]), at::Tensor()};
  }
};

struct UlyssesToSequence : torch::autograd::Function<UlyssesToSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, c10::IValue comm) {
    ctx->saved_data["comm"] = comm;
    return sequence_from_heads(*holder_of(ctx).comm, x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {heads_from_sequence(*holder_of(ctx).comm, grads[0]), at::Tensor()};
  }
};

// One step of a tensor around the ring: sent to the next ring rank while the previous rank's
// tensor of the same shape arrives. Posted at construction, so that the transfer overlaps
// whatever runs before receive().
class RingPass {
 public:
  RingPass(Comm& ring, const at::Tensor& send, int tag) : received_(at::empty_like(send)) {
    const int r = ring.rank(), n = ring.world_size();
    sent_ = ring.send(send, (r + 1) % n, tag);
    got_ = ring.recv(received_, (r + n - 1) % n, tag);
  }
  at::Tensor receive() {
    sent_.wait();
    got_.wait();
    return received_;
  }

 private:
  at::Tensor received_;
  CommWork sent_, got_;
};

constexpr int kKvTag = 0, kGradTag = 1;

// Ring attention of this ring chunk's q [Tq, h, d] against every ring rank's k/v [Tk, hkv, d].
// Step t computes against the block of ring rank (r - t) mod R while that block moves on.
struct RingAttention : torch::autograd::Function<RingAttention> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            c10::IValue comm) {
    at::NoGradGuard no_grad;
    ctx->saved_data["comm"] = comm;
    const auto& h = holder_of(ctx);
    Comm& ring = *h.comm;
    const int r = ring.rank(), n = ring.world_size();
    auto out = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    auto lse = at::full({q.size(1), q.size(0)}, -std::numeric_limits<float>::infinity(), out.options());
    std::vector<bool> covered(static_cast<size_t>(q.size(0)), false);
    auto kv = at::stack({k, v}).contiguous();  // [2, Tk, hkv, d]: one message per step
    for (int step = 0; step < n; ++step) {
      const int source = (r - step + n) % n;
      std::optional<RingPass> pass;
      if (step + 1 < n) pass.emplace(ring, kv, kKvTag);
      attention_forward_into(q, kv[0], kv[1], h.segments[source], 0, out, lse, covered);
      if (pass) kv = pass->receive();
    }
    auto result = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, result, lse});
    return result;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::NoGradGuard no_grad;
    const auto& h = holder_of(ctx);
    Comm& ring = *h.comm;
    const int r = ring.rank(), n = ring.world_size();
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto grad_out = grads[0].contiguous();
    auto dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    auto kv = at::stack({k, v}).contiguous();
    // The grads of the block this rank holds travel with it; after n steps every block's grads
    // have visited all ranks, and one last pass hands them to the block's owner.
    auto dkv = at::zeros(kv.sizes(), kv.options().dtype(at::kFloat));
    for (int step = 0; step < n; ++step) {
      const int source = (r - step + n) % n;
      std::optional<RingPass> pass;
      if (step + 1 < n) pass.emplace(ring, kv, kKvTag);
      auto dk = dkv[0], dv = dkv[1];
      attention_backward_into(grad_out, q, kv[0], kv[1], out, lse, h.segments[source], 0, dq, dk, dv);
      dkv = RingPass(ring, dkv, kGradTag).receive();
      if (pass) kv = pass->receive();
    }
    return {dq.to(q.scalar_type()), dkv[0].to(k.scalar_type()), dkv[1].to(v.scalar_type()), at::Tensor()};
  }
};

// Σ over a group in forward; the identity in backward.
struct GroupSum : torch::autograd::Function<GroupSum> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& local, c10::IValue comm) {
    ctx->saved_data["comm"] = comm;
    auto total = local.detach().clone();
    holder_of(ctx).comm->all_reduce_sum(total).wait();
    return total;
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], at::Tensor()}; }
};

}  // namespace

ContextParallel::ContextParallel(std::shared_ptr<Comm> ring, std::shared_ptr<Comm> ulysses, std::shared_ptr<Comm> cp)
    : ring_(std::move(ring)), ulysses_(std::move(ulysses)), cp_(std::move(cp)) {
  if (ring_->world_size() * ulysses_->world_size() != cp_->world_size())
    fail("context parallel: ring ", ring_->world_size(), " x ulysses ", ulysses_->world_size(), " != cp group ",
         cp_->world_size());
}

void check_ulysses_heads(const std::vector<AttentionHeads>& heads, int ulysses) {
  const int64_t u = ulysses;
  for (const auto& h : heads) {
    if (h.query % u != 0)
      fail("parallel.ulysses_parallel_size: ", u, " does not divide the ", h.query, " query heads of ", h.query_key);
    if (h.key_value % u != 0 && u % h.key_value != 0)
      fail("parallel.ulysses_parallel_size: ", u, " and the ", h.key_value, " KV heads of ", h.key_value_key,
           ": neither divides the other");
  }
}

std::shared_ptr<const SequenceSplit> ContextParallel::split(std::vector<int64_t> cu_seqlens, bool causal) const {
  return shard(std::move(cu_seqlens), causal);
}

std::shared_ptr<const SequenceShard> ContextParallel::shard(std::vector<int64_t> cu_seqlens, bool causal) const {
  check_cu_seqlens(cu_seqlens, cu_seqlens.empty() ? 0 : cu_seqlens.back(), "context parallel");
  auto s = std::shared_ptr<SequenceShard>(new SequenceShard());
  s->cu_seqlens_ = std::move(cu_seqlens);
  s->ring_ = ring_;
  s->ulysses_ = ulysses_;
  s->cp_ = cp_;
  const int64_t R = ring_->world_size(), U = ulysses_->world_size();
  const bool zigzag = causal && R > 1;
  const int64_t multiple = (zigzag ? 2 : 1) * R * U;
  const int64_t total = s->cu_seqlens_.back();
  s->padded_rows_ = (total + multiple - 1) / multiple * multiple;
  const int64_t pieces = zigzag ? 2 * R : R, piece_rows = s->padded_rows_ / pieces;
  for (int64_t j = 0; j < R; ++j) {
    std::vector<SequenceShard::Piece> chunk = {{j * piece_rows, piece_rows}};
    if (zigzag) chunk.push_back({(2 * R - 1 - j) * piece_rows, piece_rows});
    s->ring_chunks_.push_back(chunk);
  }
  // This rank's rows: part u of its ring chunk.
  const int64_t chunk_rows = s->padded_rows_ / R, part_rows = chunk_rows / U;
  std::vector<int64_t> chunk_index;
  for (const auto& piece : s->ring_chunks_[ring_->rank()])
    for (int64_t i = 0; i < piece.rows; ++i) chunk_index.push_back(piece.global_begin + i);
  const int64_t u = ulysses_->rank();
  s->local_index_.assign(chunk_index.begin() + u * part_rows, chunk_index.begin() + (u + 1) * part_rows);
  return s;
}

at::Tensor SequenceShard::take(const at::Tensor& full, double pad_value) const {
  const int64_t total = total_rows();
  if (full.dim() == 0 || full.size(0) != total)
    fail("context parallel: expected a tensor of ", total, " rows (the packed stream) to split, got ", full.sizes());
  auto index = at::tensor(local_index_, at::TensorOptions().dtype(at::kLong)).clamp_max(total).to(full.device());
  auto shape = full.sizes().vec();
  shape[0] = 1;
  auto source = at::cat({full, at::full(shape, pad_value, full.options())});  // row `total` is the pad row
  return source.index_select(0, index);
}

at::Tensor SequenceShard::real_mask(at::Device device) const {
  return at::tensor(local_index_, at::kLong).lt(total_rows()).to(device);
}

at::Tensor SequenceShard::gather(const at::Tensor& local) const {
  const int64_t rows = local_rows(), W = cp_->world_size();
  if (local.dim() == 0 || local.size(0) != rows)
    fail("context parallel: expected this rank's ", rows, " rows to gather, got ", local.sizes());
  // Every rank's rows and their global indices, block r from CP rank r (equal blocks: T_pad / W).
  auto shape = local.sizes().vec();
  shape[0] = W * rows;
  at::Tensor all = at::empty(shape, local.options());
  all.narrow(0, cp_->rank() * rows, rows).copy_(local);
  at::Tensor index = at::empty({W * rows}, local.options().dtype(at::kLong));
  index.narrow(0, cp_->rank() * rows, rows).copy_(at::tensor(local_index_, at::kLong));
  cp_->all_gather_in_place({all.view({-1}), index}).wait();  // one collective for both
  const at::Tensor real = index.lt(total_rows()).nonzero().view(-1);
  shape[0] = total_rows();
  return at::empty(shape, local.options()).index_copy_(0, index.index_select(0, real), all.index_select(0, real));
}

std::vector<AttentionSegment> SequenceShard::ring_segments(int mine, int source, bool causal) const {
  std::vector<AttentionSegment> segments;
  int64_t q_offset = 0;
  for (const auto& qa : ring_chunks_[mine]) {
    int64_t k_offset = 0;
    for (const auto& kb : ring_chunks_[source]) {
      const bool same = qa.global_begin == kb.global_begin;
      if (!causal || same || kb.global_begin < qa.global_begin) {
        for (size_t i = 0; i + 1 < cu_seqlens_.size(); ++i) {
          const int64_t sb = cu_seqlens_[i], se = cu_seqlens_[i + 1];
          const int64_t q_lo = std::max(qa.global_begin, sb), q_hi = std::min(qa.global_begin + qa.rows, se);
          const int64_t k_lo = std::max(kb.global_begin, sb), k_hi = std::min(kb.global_begin + kb.rows, se);
          if (q_lo < q_hi && k_lo < k_hi)
            segments.push_back({q_offset + q_lo - qa.global_begin, q_hi - q_lo, k_offset + k_lo - kb.global_begin,
                                k_hi - k_lo, causal && same});
        }
      }
      k_offset += kb.rows;
    }
    q_offset += qa.rows;
  }
  return segments;
}

at::Tensor SequenceShard::attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    bool causal) const {
  if (q.size(0) != local_rows() || k.size(0) != local_rows())
    fail("context parallel attention: expected ", local_rows(), " local rows, got q ", q.sizes(), ", k ", k.sizes());
  const int64_t U = ulysses_->world_size(), kv_heads = k.size(1);
  at::Tensor qh = q, kh = k, vh = v;
  if (U > 1) {
    check_ulysses_heads({{q.size(1), kv_heads, "q", "k"}}, static_cast<int>(U));
    if (kv_heads % U != 0) {
      // Fewer KV heads than Ulysses ranks: each rank gets a copy of the KV head its q heads use.
      kh = k.repeat_interleave(U / kv_heads, 1);
      vh = v.repeat_interleave(U / kv_heads, 1);
    }
    qh = UlyssesToHeads::apply(q, capsule(ulysses_));
    kh = UlyssesToHeads::apply(kh, capsule(ulysses_));
    vh = UlyssesToHeads::apply(vh, capsule(ulysses_));
  }
  const int R = ring_->world_size(), r = ring_->rank();
  at::Tensor out;
  if (R == 1) {
    out = attention_segments(qh, kh, vh, ring_segments(0, 0, causal)).out;
  } else {
    std::vector<std::vector<AttentionSegment>> per_source;
    for (int source = 0; source < R; ++source) per_source.push_back(ring_segments(r, source, causal));
    for (const auto& segments : per_source) check_attention_inputs(qh, kh, vh, segments);
    out = RingAttention::apply(qh, kh, vh, capsule(ring_, std::move(per_source)));
  }
  return U > 1 ? UlyssesToSequence::apply(out, capsule(ulysses_)) : out;
}

at::Tensor SequenceShard::sum(const at::Tensor& local) const {
  return GroupSum::apply(local, capsule(cp_));
}

int64_t SequenceShard::sum(int64_t local) const {
  return static_cast<int64_t>(cp_->all_reduce_sum(static_cast<double>(local)));
}

}  // namespace mmtrain
