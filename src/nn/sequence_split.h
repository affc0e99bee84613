// What a model sees of its packed sequence (samples at cu_seqlens, T rows in all): the rows this
// rank computes, attention among them within each sample, and sums over the ranks that share the
// sequence. A model asks its splitter for the split of each batch and never knows whether it is
// the whole sequence (the default) or this rank's share under context parallelism
// (parallel/context_parallel.h installs that splitter); torchtitan's models know nothing of CP
// either. The contract a split keeps:
//   take(full [T, ...])    -> this rank's rows [local_rows, ...], padding rows filled with pad_value
//   attention(q, k, v)     -> every local row attends exactly what it would see unsplit
//   sum(x)                 -> Σ over the ranks that share the sequence (autograd: this rank's share)
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

// Checks cu_seqlens of a packed stream of total_rows rows: at least one sample, from 0 to
// total_rows, never decreasing (empty samples allowed). `what` names the source in errors
// ("batch 'cu_seqlens'", "varlen attention").
void check_cu_seqlens(const std::vector<int64_t>& cu_seqlens, int64_t total_rows, const std::string& what);
// The same, reading a batch's int tensor (any device) into a vector.
std::vector<int64_t> cu_seqlens_from(const at::Tensor& cu_seqlens, int64_t total_rows, const std::string& what);
// Which sequence each row of a packed stream belongs to: int64 [cu_seqlens.back()] on device,
// n for the rows [cu_seqlens[n], cu_seqlens[n + 1]) (per-sequence sums by index_add).
at::Tensor sequence_of_rows(const std::vector<int64_t>& cu_seqlens, const at::Device& device);

class SequenceSplit {
 public:
  virtual ~SequenceSplit() = default;
  virtual bool is_split() const = 0;  // false: every row local, attention = varlen_attention
  virtual int64_t local_rows() const = 0;
  virtual at::Tensor take(const at::Tensor& full, double pad_value = 0) const = 0;
  // q [T_loc, Hq, d], k and v [T_loc, Hkv, d] -> [T_loc, Hq, d].
  virtual at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) const = 0;
  virtual at::Tensor sum(const at::Tensor& local) const = 0;
  virtual int64_t sum(int64_t local) const = 0;
};

// The identity split: one rank computes the whole sequence.
std::shared_ptr<const SequenceSplit> whole_sequence(std::vector<int64_t> cu_seqlens);

class SequenceSplitter {
 public:
  virtual ~SequenceSplitter() = default;
  // causal: the attention the model runs is causal (a split may balance its work differently).
  virtual std::shared_ptr<const SequenceSplit> split(std::vector<int64_t> cu_seqlens, bool causal) const = 0;
  virtual int ways() const = 0;  // ranks one sequence is split over
};

// The heads of a model's attention, for a splitter that splits them (Ulysses), with the config
// keys that set them (for messages).
struct AttentionHeads {
  int64_t query = 0, key_value = 0;
  std::string query_key, key_value_key;
};

// A model whose forward runs over one packed sequence that may be split: it declares its heads
// and takes its splits from here, the whole sequence unless a splitter was installed.
class SplitsSequence {
 public:
  virtual ~SplitsSequence() = default;
  virtual std::vector<AttentionHeads> attention_heads() const = 0;
  void use_sequence_splitter(std::shared_ptr<const SequenceSplitter> splitter) { splitter_ = std::move(splitter); }

 protected:
  std::shared_ptr<const SequenceSplit> split_sequence(std::vector<int64_t> cu_seqlens, bool causal) const;
  // This rank's share of work done over the whole sequence (its FLOPs).
  double rank_share(double whole) const { return splitter_ ? whole / splitter_->ways() : whole; }

 private:
  std::shared_ptr<const SequenceSplitter> splitter_;  // null: the whole sequence
};

}  // namespace mmtrain
