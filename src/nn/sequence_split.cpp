#include "nn/sequence_split.h"

#include "core/error.h"
#include "nn/attention.h"

namespace mmtrain {

void check_cu_seqlens(const std::vector<int64_t>& cu_seqlens, int64_t total_rows, const std::string& what) {
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != total_rows)
    fail(what, ": cu_seqlens must run from 0 to T = ", total_rows, " (the packed rows) with at least one sample, got ",
         cu_seqlens.size(), " entries ending at ", cu_seqlens.empty() ? -1 : cu_seqlens.back());
  for (size_t i = 1; i < cu_seqlens.size(); ++i)
    if (cu_seqlens[i] < cu_seqlens[i - 1]) fail(what, ": cu_seqlens decreases at entry ", i);
}

at::Tensor sequence_of_rows(const std::vector<int64_t>& cu_seqlens, const at::Device& device) {
  std::vector<int64_t> owner(static_cast<size_t>(cu_seqlens.back()));
  for (size_t n = 0; n + 1 < cu_seqlens.size(); ++n)
    std::fill(owner.begin() + cu_seqlens[n], owner.begin() + cu_seqlens[n + 1], static_cast<int64_t>(n));
  return at::tensor(owner, at::kLong).to(device);
}

std::vector<int64_t> cu_seqlens_from(const at::Tensor& cu_seqlens, int64_t total_rows, const std::string& what) {
  if (cu_seqlens.dim() != 1 || at::isFloatingType(cu_seqlens.scalar_type()))
    fail(what, ": expected a 1-D integer tensor, got ", cu_seqlens.scalar_type(), " ", cu_seqlens.sizes());
  const auto cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> out(cu.data_ptr<int64_t>(), cu.data_ptr<int64_t>() + cu.numel());
  check_cu_seqlens(out, total_rows, what);
  return out;
}

namespace {

class WholeSequence : public SequenceSplit {
 public:
  explicit WholeSequence(std::vector<int64_t> cu_seqlens) : cu_seqlens_(std::move(cu_seqlens)) {}
  bool is_split() const override { return false; }
  int64_t local_rows() const override { return cu_seqlens_.back(); }
  at::Tensor take(const at::Tensor& full, double) const override { return full; }
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal) const override {
    return varlen_attention(q, k, v, cu_seqlens_, causal).out;
  }
  at::Tensor sum(const at::Tensor& local) const override { return local; }
  int64_t sum(int64_t local) const override { return local; }

 private:
  std::vector<int64_t> cu_seqlens_;
};

}  // namespace

std::shared_ptr<const SequenceSplit> whole_sequence(std::vector<int64_t> cu_seqlens) {
  check_cu_seqlens(cu_seqlens, cu_seqlens.empty() ? 0 : cu_seqlens.back(), "sequence");
  return std::make_shared<WholeSequence>(std::move(cu_seqlens));
}

std::shared_ptr<const SequenceSplit> SplitsSequence::split_sequence(std::vector<int64_t> cu_seqlens, bool causal) const {
  return splitter_ ? splitter_->split(std::move(cu_seqlens), causal) : whole_sequence(std::move(cu_seqlens));
}

}  // namespace mmtrain
