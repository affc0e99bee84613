// MagiHuman's HF adapter: parameter "dit.<name>" is HF key "<name>"; a SwiGLU7 layer's
// up_gate_proj rows are interleaved on disk (row 2j gate j, row 2j+1 linear j, per expert block
// of 2I rows) and, with model.config.deinterleave_mlp, contiguous halves [gate | linear] inside
// the trainer. Loading, export and debug gradients convert; the count of converted tensors must
// equal the number of SwiGLU7 layers.
#pragma once
#include "models/hf_adapter.h"
#include "models/magihuman/config.h"

namespace mmtrain::magihuman {

class MagiHumanHfAdapter : public HfAdapter {
 public:
  explicit MagiHumanHfAdapter(MagiHumanConfig config) : c_(std::move(config)) {}
  std::string hf_key(const std::string& param_name) const override;
  bool layout_differs(const std::string& param_name) const override;
  at::Tensor load_rows(const std::string& param_name, int64_t begin, int64_t end,
                       const HfRowReader& read) const override;
  at::Tensor to_hf_layout(const std::string& param_name, const at::Tensor& full) const override;
  int64_t expected_layout_conversions() const override;

 private:
  // Layer index when param_name is a gated (SwiGLU7) layer's up_gate_proj, else -1.
  int64_t gated_layer_of(const std::string& param_name) const;

  MagiHumanConfig c_;
};

}  // namespace mmtrain::magihuman
