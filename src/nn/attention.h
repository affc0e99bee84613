// Attention over packed (varlen) sequences: the one attention op of every model, and the kernel
// the context-parallel algorithms (parallel/context_parallel.h) are built from.
//
// Letters: Tq, Tk rows of q and k (tokens of several samples packed along dim 0), Hq query heads,
// Hkv key/value heads (Hq % Hkv == 0: grouped-query attention), d head dim.
//
// Work is a list of segments: q rows [q_begin, q_begin + q_len) attend to k/v rows [k_begin,
// k_begin + k_len), fully or causally (causal: q_len == k_len, the same positions, row i sees
// rows <= i). A q row may take part in several segments (the blocks of a ring, the pieces of a
// sample): its result is the softmax over the union of what it sees, assembled from the partial
// results through their log-sum-exp. Rows in no segment give out 0 and lse -inf.
//
// On CPU each segment is one call of ATen's flash attention (it returns the log-sum-exp and has a
// backward that takes the final out and lse, which is what makes blocks composable; the backward
// of full bf16 segments on a CPU with AMX is nn/attention_amx.h's, same contract and numerics,
// 1.7x faster; MMTRAIN_CPU_ATTENTION=aten keeps ATen's). On a GPU, bf16/fp16 segments with a head
// dim that is a multiple of 8 (<= 256) are one call each of ATen's CUDA flash attention, which has
// the same contract (GQA k/v as they are); everything else takes a math fallback with the same
// contract (fp32 softmax, [Hq, q_len, k_len] scores). In fp32 they match a naive softmax to ~1e-7.
// The CUDA flash path is unrun until scripts/gpu_check.sh runs it on a GPU (docs/gpu.md).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace mmtrain {

struct AttentionSegment {
  int64_t q_begin = 0, q_len = 0;
  int64_t k_begin = 0, k_len = 0;
  bool causal = false;
};

// Segments of packed samples: sample i is rows [cu_seqlens[i], cu_seqlens[i+1]) of both q and k.
std::vector<AttentionSegment> sample_segments(const std::vector<int64_t>& cu_seqlens, bool causal);

struct AttentionOutput {
  at::Tensor out;  // [Tq, Hq, d], q's dtype
  at::Tensor lse;  // [Hq, Tq] fp32: log Σ exp(scale q·k) over what each row sees
};

// out/lse of segments, with autograd through q, k and v (q [Tq, Hq, d], k and v [Tk, Hkv, d],
// one dtype). scale <= 0 means 1/sqrt(d).
AttentionOutput attention_segments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   std::vector<AttentionSegment> segments, double scale = 0);

// The models' case: samples packed along T, attention within each sample only.
AttentionOutput varlen_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::vector<int64_t>& cu_seqlens, bool causal);

// The kernels, without autograd, for algorithms that move k/v between calls (ring attention).
// Forward: merges every segment's partial result into (out, lse), which hold the results so far
// (lse -inf where nothing yet; out any float dtype, fp32 when results are merged). `covered`
// [Tq] marks the rows that already hold a result: their partial results are merged through the
// log-sum-exp, the others are copied.
void attention_forward_into(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<AttentionSegment>& segments, double scale, at::Tensor& out,
                            at::Tensor& lse, std::vector<bool>& covered);
// Backward of segments given the final out and lse (over everything each row sees) and the
// grad of out: adds the segments' contributions to dq [Tq, Hq, d], dk and dv [Tk, Hkv, d].
void attention_backward_into(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                             const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                             const std::vector<AttentionSegment>& segments, double scale, at::Tensor& dq,
                             at::Tensor& dk, at::Tensor& dv);

// Checks shapes and segment bounds; fails naming what is wrong.
void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const std::vector<AttentionSegment>& segments);

}  // namespace mmtrain
