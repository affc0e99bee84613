// The backward of one attention segment in bf16 on a CPU with AMX, through oneDNN's
// batch-reduce GEMM as ATen exports it (at::native::cpublas::brgemm: bf16 x bf16 -> fp32 tile
// GEMMs), for the full (non-causal) segments of attention.h. ATen's CPU flash attention backward
// takes its bf16 GEMMs through the BLAS-like oneDNN call on small blocks: at MagiHuman's bench
// shape (4606 tokens, 8 / 2 heads of 128) this kernel takes its backward from ~970 to ~560 ms on
// one Xeon core (docs/performance.md). The forward stays ATen's: a forward written the same way
// measured 10 % slower than ATen's, whose online softmax over 512-key blocks stays in cache.
// Numerics as ATen's: fp32 scores, probabilities and accumulation; p and ds rounded to bf16 for
// their GEMMs; dq, dk, dv rounded once.
//
// Letters: ql, kl rows of q and k; Hq, Hkv heads (G = Hq / Hkv query heads per key/value head);
// d head dim.
//
// FlashAttention-2's loop order: per key/value head and chunk of 512 keys, per block of 64
// queries and query head of the group, the transposed tiles sᵀ = k·qᵀ and dpᵀ = v·doᵀ,
// pᵀ = exp(scale sᵀ - lse), dsᵀ = pᵀ (dpᵀ - D) with D = rowsum(do · out), and dqᵀ += kᵀ·dsᵀ in an
// fp32 accumulator per head and query block; then, for the G heads of the group at once,
// dv += pᵀ·do and dk += dsᵀ·q in fp32 tiles that stay in cache. dk = scale dk, dq = scale dq.
#pragma once
#include <ATen/ATen.h>

#include <tuple>

namespace mmtrain {

// MMTRAIN_CPU_ATTENTION, read once: unset, empty or `auto` lets the kernel run where it is usable;
// `aten` keeps ATen's backward everywhere (A/B runs); any other value fails naming it. `mmtrain
// train` asks at start-up, so a misspelt value stops the run before anything is built.
bool amx_attention_enabled();

// Whether amx_attention_backward takes the segment: bf16, not causal, head dim a multiple of 64,
// a CPU for which oneDNN's ukernel packs bf16 (cpublas::could_pack: AMX; oneDNN may also say yes
// on AVX512-BF16 CPUs without AMX, where the kernel is exact but its speed was not measured) and
// has AVX-512, and amx_attention_enabled().
bool amx_attention_backward_usable(const at::Tensor& q, bool causal);

// q [ql, Hq, d], k and v [kl, Hkv, d] (bf16, unit stride along d); grad_out and out [ql, Hq, d],
// lse [Hq, ql] fp32: the final out and lse of these q rows (over everything they see, which may
// be more than this segment). Returns dq [ql, Hq, d], dk and dv [kl, Hkv, d], bf16.
std::tuple<at::Tensor, at::Tensor, at::Tensor> amx_attention_backward(const at::Tensor& grad_out, const at::Tensor& q,
                                                                      const at::Tensor& k, const at::Tensor& v,
                                                                      const at::Tensor& out, const at::Tensor& lse,
                                                                      double scale);

}  // namespace mmtrain
