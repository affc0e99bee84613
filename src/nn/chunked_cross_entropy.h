// Output projection + cross-entropy (or per-row log-probabilities) without the [N, V] logits: for a 131072-token vocabulary the
// fp32 logits of a 2048-token sample are 1 GiB, and autograd keeps them (and their softmax) for
// backward. Here forward and backward walk the N rows in chunks, recomputing each chunk's logits
// in backward, so the extra memory is one [chunk, V] block (the seed's chunked loss).
//
// loss = Σ over rows with labels != ignore_index of CE(float(hidden @ weight^T), label), divided by
// normalizer, or by the count of such rows when normalizer <= 0: then the same value as
// at::cross_entropy_loss(at::linear(hidden, weight).to(kFloat), labels) with ignore_index and mean
// reduction. 0 (with zero grads) when no row is supervised. (Context parallelism passes the count
// over all CP ranks as normalizer, so that the ranks' losses add up to the mean.)
// Logits are computed in hidden's dtype and upcast, as the unchunked path does; softmax, the
// grad of the logits and the weight-grad accumulation run in fp32, the grads are returned in the
// inputs' dtypes. In fp32 it matches the unchunked loss and grads to rounding (tested at 1e-6).
#pragma once
#include <ATen/ATen.h>

namespace mmtrain {

// hidden [N, H], weight [V, H] (same dtype), labels int64 [N]; chunk_rows >= 1.
at::Tensor chunked_linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                        int64_t chunk_rows, int64_t ignore_index = -100, double normalizer = 0);

// Each row's log-probability of its label, fp32 [N]: log_softmax(float(hidden @ weight^T))[label],
// 0 on rows whose label is ignore_index, with the same chunked forward and recomputing backward as
// above (its gradient is grad_i x (onehot(label_i) - softmax_i) per row). What a preference
// objective sums per sequence (models/model.h, kSequenceLogProbsKey). temperature: the logits are
// divided by it first (fp32), as a sampler at that temperature draws (GRPO's per-token log-probs).
at::Tensor chunked_linear_log_probs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                    int64_t chunk_rows, int64_t ignore_index = -100, double temperature = 1.0);

// Each row's entropy of softmax(float(hidden @ weight^T) / temperature), fp32 [N], no grad; 0 on
// rows whose label is ignore_index (their logits are not computed). GRPO's entropy metric.
at::Tensor chunked_linear_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& labels,
                                  int64_t chunk_rows, int64_t ignore_index = -100, double temperature = 1.0);

}  // namespace mmtrain
