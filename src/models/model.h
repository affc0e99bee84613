// What a trainable model is to the trainer: a Module tree whose forward maps a collated Batch to
// a scalar loss, plus the FLOPs that costs. Everything else a model family brings (its HF
// adapter, config inference, FLOPs tool, activation estimate) is in its ModelSpec
// (models/model_spec.h).
#pragma once
#include "core/batch.h"
#include "nn/module.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

// A token-budget step's loss normalizers (data.dataloader_param.micro_batch_tokens): batch key
// "loss_normalizer", float64 [terms], each loss term's count (Model::loss_counts) summed over the
// step's whole global batch, every micro-batch of every data-parallel rank (train/train_step.h).
// With it a micro-batch's loss is its share of the global batch's loss: Σ_k (its sum of term k) /
// normalizer[k]. Without it, each term is this micro-batch's mean.
inline constexpr const char* kLossNormalizerKey = "loss_normalizer";
// normalizer[term] when the batch carries normalizers, else nullopt.
std::optional<double> loss_normalizer(const Batch& batch, size_t term);

// Preference objectives (train/objective.h) ask a language model for each sequence's
// log-probability instead of a loss: with batch key "sequence_log_probs" present (any value), the
// forward fills ModelOutput::sequence_log_probs and sequence_tokens, one entry per sequence (the
// batch's rows, or its packed samples at cu_seqlens), and its loss is not computed. A model that
// cannot fails naming the key.
inline constexpr const char* kSequenceLogProbsKey = "sequence_log_probs";
// GRPO (rl/grpo_objective.h) asks a language model for every token's log-probability instead of
// a loss: with batch key "token_log_probs" (a float64 scalar, the sampling temperature T), the
// forward fills ModelOutput::token_log_probs and token_entropies over the T = B x S rows of the
// stream (the batch's rows one after the other, or its packed row), and its loss is not computed.
inline constexpr const char* kTokenLogProbsKey = "token_log_probs";
// A diffusion model's counterpart (Flow-DPO): with batch key "sample_term_losses" present, the
// forward fills ModelOutput::sample_term_losses, each packed sample's own flow-matching loss per
// term, and its loss is not computed.
inline constexpr const char* kSampleTermLossesKey = "sample_term_losses";
// A preference micro-batch (data/conversation/preference_collator.h): int64 scalar P, its rows being
// P chosen sequences, then their P rejected ones.
inline constexpr const char* kPreferencePairsKey = "preference_pairs";

struct ModelOutput {
  at::Tensor loss;                        // scalar fp32: this micro-batch's mean, or its share (above)
  int64_t tokens = 0;                     // tokens processed (for throughput)
  std::map<std::string, double> metrics;  // an objective's metric sums, added up by the step (train/objective.h)
  std::map<std::string, at::Tensor> tensors;  // named outputs for debugging ("prediction")
  // A model of several loss terms (MagiHuman: video, audio): each term's part of `loss`, in the
  // order of loss_counts (its mean, or its sum / normalizer). Evaluation reads the terms' sums
  // from it (train/evaluate.h); empty for a one-term model, whose term is `loss`.
  std::vector<at::Tensor> term_losses;
  // kSequenceLogProbsKey: fp32 [N], Σ over sequence n's supervised tokens of log p(label), with
  // grad; and fp32 [N], those tokens' count.
  at::Tensor sequence_log_probs, sequence_tokens;
  // kTokenLogProbsKey: fp32 [B x S], row t's log softmax(logits_t / T)[labels[t + 1]] (the token
  // it predicts, within its row or packed sample), 0 where that label is -100, with grad; and fp32
  // [B x S], the entropy of softmax(logits_t / T) on the same rows (0 elsewhere), without grad.
  at::Tensor token_log_probs, token_entropies;
  // kSampleTermLossesKey: fp32 [N, terms], sample n's mean squared error of term k (in
  // loss_term_names order) over its own supervised elements (0 where it has none), with grad; the
  // whole sample's under context parallelism, on every CP rank.
  at::Tensor sample_term_losses;
};

class Model : public Module {
 public:
  virtual ModelOutput forward(const Batch& batch) = 0;
  // Model FLOPs of forward + backward on this batch (convention in docs/flops.md); 0 = unknown.
  virtual double train_flops(const Batch& batch) const { return 0.0; }
  // The counts the loss terms of this batch are means over, in the order of loss_normalizer
  // (MagiHuman: supervised video and audio elements; a language model: supervised tokens).
  // Empty: the model cannot normalize over a global batch, and token-budget steps refuse it.
  virtual std::vector<double> loss_counts(const Batch& batch) const { return {}; }
  // The names of the loss terms, in that order, for a model of several (MagiHuman: "video",
  // "audio"; the evaluation records eval_loss_<name>); empty for one.
  virtual std::vector<std::string> loss_term_names() const { return {}; }
};

}  // namespace mmtrain
