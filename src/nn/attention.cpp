#include "nn/attention.h"

#include "core/error.h"
#include "nn/attention_amx.h"
#include "nn/sequence_split.h"

#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>
#include <optional>

namespace mmtrain {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [n, H, d] rows -> the [1, H, n, d] view the SDPA kernels take.
at::Tensor to_heads(const at::Tensor& t, int64_t begin, int64_t n) {
  return t.narrow(0, begin, n).transpose(0, 1).unsqueeze(0);
}
at::Tensor from_heads(const at::Tensor& t) { return t.squeeze(0).transpose(0, 1); }

std::optional<double> scale_arg(double scale) { return scale > 0 ? std::optional<double>(scale) : std::nullopt; }
double effective_scale(double scale, int64_t head_dim) {
  return scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

// ATen's CUDA flash attention takes half-precision q/k/v with a head dim that is a multiple of 8,
// up to 256, and grouped-query k/v as they are (Hq % Hkv == 0); anything else on a GPU takes the
// math fallback.
bool cuda_flash_usable(const at::Tensor& q, const at::Tensor& k) {
  const auto dtype = q.scalar_type();
  return q.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) && k.scalar_type() == dtype &&
         q.size(2) % 8 == 0 && q.size(2) <= 256;
}

// One segment: out [ql, Hq, d] (q's dtype), lse [Hq, ql] fp32.
std::pair<at::Tensor, at::Tensor> segment_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const AttentionSegment& s, double scale) {
  auto qs = to_heads(q, s.q_begin, s.q_len), ks = to_heads(k, s.k_begin, s.k_len), vs = to_heads(v, s.k_begin, s.k_len);
  if (q.is_cpu()) {
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(qs, ks, vs, 0.0, s.causal, std::nullopt,
                                                                  scale_arg(scale));
    return {from_heads(o), l.squeeze(0)};
  }
  if (cuda_flash_usable(q, k)) {
    const auto result = at::_scaled_dot_product_flash_attention(qs, ks, vs, 0.0, s.causal, /*return_debug_mask=*/false,
                                                                scale_arg(scale));
    return {from_heads(std::get<0>(result)), std::get<1>(result).squeeze(0)};  // lse [1, Hq, ql] -> [Hq, ql]
  }
  // Math fallback: the same contract in explicit fp32 softmax (kv heads expanded to the q heads).
  const int64_t group = q.size(1) / k.size(1);
  auto qf = qs.squeeze(0).to(at::kFloat);
  auto kf = ks.squeeze(0).to(at::kFloat).repeat_interleave(group, 0);
  auto vf = vs.squeeze(0).to(at::kFloat).repeat_interleave(group, 0);
  auto scores = at::matmul(qf, kf.transpose(1, 2)) * effective_scale(scale, q.size(2));  // [Hq, ql, kl]
  if (s.causal) scores.masked_fill_(at::ones({s.q_len, s.k_len}, q.options().dtype(at::kBool)).triu(1), -INFINITY);
  auto lse = at::logsumexp(scores, -1);
  auto out = at::matmul(at::exp(scores - lse.unsqueeze(-1)), vf);  // [Hq, ql, d]
  return {out.transpose(0, 1).to(q.scalar_type()), lse};
}

// One segment's dq [ql, Hq, d], dk and dv [kl, Hkv, d], given the final out and lse of its rows.
std::tuple<at::Tensor, at::Tensor, at::Tensor> segment_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                const at::Tensor& k, const at::Tensor& v,
                                                                const at::Tensor& out, const at::Tensor& lse,
                                                                const AttentionSegment& s, double scale) {
  if (amx_attention_backward_usable(q, s.causal))
    return amx_attention_backward(grad_out.narrow(0, s.q_begin, s.q_len), q.narrow(0, s.q_begin, s.q_len),
                                  k.narrow(0, s.k_begin, s.k_len), v.narrow(0, s.k_begin, s.k_len),
                                  out.narrow(0, s.q_begin, s.q_len), lse.narrow(1, s.q_begin, s.q_len),
                                  effective_scale(scale, q.size(2)));
  auto qs = to_heads(q, s.q_begin, s.q_len), ks = to_heads(k, s.k_begin, s.k_len), vs = to_heads(v, s.k_begin, s.k_len);
  auto gs = to_heads(grad_out, s.q_begin, s.q_len), os = to_heads(out, s.q_begin, s.q_len);
  auto ls = lse.narrow(1, s.q_begin, s.q_len).unsqueeze(0).contiguous();  // [1, Hq, ql]
  if (q.is_cpu()) {
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        gs, qs, ks, vs, os, ls, 0.0, s.causal, std::nullopt, scale_arg(scale));
    return {from_heads(dq), from_heads(dk), from_heads(dv)};
  }
  if (cuda_flash_usable(q, k)) {
    // Without dropout the kernel reads no random state: the seed and offset are placeholders. Its
    // backward takes out and grad in q's dtype (a ring's merged out may be fp32).
    const auto placeholder = at::zeros({2}, q.options().dtype(at::kLong));
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_backward(
        gs.to(q.scalar_type()), qs, ks, vs, os.to(q.scalar_type()), ls, at::Tensor(), at::Tensor(), s.q_len, s.k_len,
        0.0, s.causal, placeholder, placeholder, scale_arg(scale));
    return {from_heads(dq), from_heads(dk), from_heads(dv)};
  }
  const int64_t hkv = k.size(1), group = q.size(1) / hkv;
  const double sc = effective_scale(scale, q.size(2));
  auto qf = qs.squeeze(0).to(at::kFloat), gf = gs.squeeze(0).to(at::kFloat), of = os.squeeze(0).to(at::kFloat);
  auto kf = ks.squeeze(0).to(at::kFloat).repeat_interleave(group, 0);
  auto vf = vs.squeeze(0).to(at::kFloat).repeat_interleave(group, 0);
  auto scores = at::matmul(qf, kf.transpose(1, 2)) * sc;
  if (s.causal) scores.masked_fill_(at::ones({s.q_len, s.k_len}, q.options().dtype(at::kBool)).triu(1), -INFINITY);
  auto p = at::exp(scores - ls.squeeze(0).unsqueeze(-1));              // [Hq, ql, kl]
  auto dp = at::matmul(gf, vf.transpose(1, 2));
  auto ds = p * (dp - (gf * of).sum(-1, true));
  auto dq = at::matmul(ds, kf) * sc;                                   // [Hq, ql, d]
  auto dk = (at::matmul(ds.transpose(1, 2), qf) * sc).view({hkv, group, s.k_len, -1}).sum(1);
  auto dv = at::matmul(p.transpose(1, 2), gf).view({hkv, group, s.k_len, -1}).sum(1);
  return {dq.transpose(0, 1).to(q.scalar_type()), dk.transpose(0, 1).to(k.scalar_type()),
          dv.transpose(0, 1).to(v.scalar_type())};
}

// Segments travel through autograd's saved_data as 5 integers each.
std::vector<int64_t> pack(const std::vector<AttentionSegment>& segments) {
  std::vector<int64_t> flat;
  for (const auto& s : segments) flat.insert(flat.end(), {s.q_begin, s.q_len, s.k_begin, s.k_len, s.causal ? 1 : 0});
  return flat;
}
std::vector<AttentionSegment> unpack(const std::vector<int64_t>& flat) {
  std::vector<AttentionSegment> segments;
  for (size_t i = 0; i + 4 < flat.size(); i += 5)
    segments.push_back({flat[i], flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4] != 0});
  return segments;
}

struct AttentionSegmentsFunction : torch::autograd::Function<AttentionSegmentsFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               std::vector<int64_t> packed_segments, double scale) {
    const auto segments = unpack(packed_segments);
    auto out = at::zeros(q.sizes(), q.options());
    auto lse = at::full({q.size(1), q.size(0)}, -std::numeric_limits<float>::infinity(), q.options().dtype(at::kFloat));
    std::vector<bool> covered(static_cast<size_t>(q.size(0)), false);
    attention_forward_into(q, k, v, segments, scale, out, lse, covered);
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["segments"] = packed_segments;
    ctx->saved_data["scale"] = scale;
    ctx->mark_non_differentiable({lse});
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto segments = unpack(ctx->saved_data["segments"].toIntVector());
    auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
    if (grads[0].defined())
      attention_backward_into(grads[0], q, k, v, out, lse, segments, ctx->saved_data["scale"].toDouble(), dq, dk, dv);
    return {dq, dk, dv, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<AttentionSegment> sample_segments(const std::vector<int64_t>& cu_seqlens, bool causal) {
  std::vector<AttentionSegment> segments;
  for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) {
    const int64_t begin = cu_seqlens[i], n = cu_seqlens[i + 1] - begin;
    if (n > 0) segments.push_back({begin, n, begin, n, causal});
  }
  return segments;
}

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<AttentionSegment>& segments) {
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3)
    fail("attention: expected q, k, v as [T, H, d], got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  if (k.sizes() != v.sizes()) fail("attention: k ", k.sizes(), " and v ", v.sizes(), " differ");
  if (q.size(2) != k.size(2)) fail("attention: head dims differ, q ", q.size(2), ", k ", k.size(2));
  if (k.size(1) == 0 || q.size(1) % k.size(1) != 0)
    fail("attention: ", q.size(1), " query heads are not a multiple of ", k.size(1), " key/value heads");
  if (q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type())
    fail("attention: q, k, v must share a dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ", v.scalar_type());
  for (const auto& s : segments) {
    if (s.q_begin < 0 || s.q_len < 0 || s.q_begin + s.q_len > q.size(0) || s.k_begin < 0 || s.k_len < 0 ||
        s.k_begin + s.k_len > k.size(0))
      fail("attention: segment q [", s.q_begin, ", +", s.q_len, ") k [", s.k_begin, ", +", s.k_len,
           ") is outside q rows ", q.size(0), " / k rows ", k.size(0));
    if (s.causal && s.q_len != s.k_len)
      fail("attention: a causal segment needs as many q as k rows, got ", s.q_len, " and ", s.k_len);
  }
}

void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<AttentionSegment>& segments, double scale, at::Tensor& out,
                            at::Tensor& lse, std::vector<bool>& covered) {
  at::NoGradGuard no_grad;
  for (const auto& s : segments) {
    if (s.q_len == 0 || s.k_len == 0) continue;
    auto [o, l] = segment_forward(q, k, v, s, scale);
    auto out_rows = out.narrow(0, s.q_begin, s.q_len);
    auto lse_rows = lse.narrow(1, s.q_begin, s.q_len);
    bool any_covered = false;
    for (int64_t r = s.q_begin; r < s.q_begin + s.q_len; ++r) any_covered = any_covered || covered[r];
    if (!any_covered) {
      out_rows.copy_(o);
      lse_rows.copy_(l);
    } else {
      // softmax over the union: lse = log(e^a + e^b); out = out_a e^(a - lse) + out_b e^(b - lse).
      const auto merged = at::logaddexp(lse_rows, l);
      const auto keep = at::exp(lse_rows - merged).transpose(0, 1).unsqueeze(-1);  // [ql, Hq, 1]
      const auto take = at::exp(l - merged).transpose(0, 1).unsqueeze(-1);
      out_rows.copy_(out_rows.to(at::kFloat) * keep + o.to(at::kFloat) * take);
      lse_rows.copy_(merged);
    }
    for (int64_t r = s.q_begin; r < s.q_begin + s.q_len; ++r) covered[r] = true;
  }
}

void attention_backward_into(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                             const std::vector<AttentionSegment>& segments, double scale, at::Tensor& dq,
                             at::Tensor& dk, at::Tensor& dv) {
  at::NoGradGuard no_grad;
  for (const auto& s : segments) {
    if (s.q_len == 0 || s.k_len == 0) continue;
    auto [gq, gk, gv] = segment_backward(grad_out, q, k, v, out, lse, s, scale);
    dq.narrow(0, s.q_begin, s.q_len).add_(gq);
    dk.narrow(0, s.k_begin, s.k_len).add_(gk);
    dv.narrow(0, s.k_begin, s.k_len).add_(gv);
  }
}

AttentionOutput attention_segments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   std::vector<AttentionSegment> segments, double scale) {
  check_attention_inputs(q, k, v, segments);
  auto outputs = AttentionSegmentsFunction::apply(q, k, v, pack(segments), scale);
  return {outputs[0], outputs[1]};
}

AttentionOutput varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::vector<int64_t>& cu_seqlens, bool causal) {
  if (q.size(0) != k.size(0)) fail("varlen attention: q has ", q.size(0), " rows and k ", k.size(0), ", expected the same");
  check_cu_seqlens(cu_seqlens, q.size(0), "varlen attention");
  return attention_segments(q, k, v, sample_segments(cu_seqlens, causal));
}

}  // namespace mmtrain
