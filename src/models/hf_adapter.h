// The IO boundary between a model's own parameter names and row layouts and its public HF
// checkpoint (torchtitan's state_dict_adapter). Loading HF weights, `convert`, `debug step`'s
// gradients and the weight fixtures translate here and nowhere else; inside, the model keeps its
// own names (MagiHuman's "dit." prefix) and layouts (de-interleaved gated-MLP rows).
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace mmtrain {

// read(key, row_begin, row_end): rows of a tensor as stored in the HF checkpoint.
using HfRowReader = std::function<at::Tensor(const std::string& key, int64_t row_begin, int64_t row_end)>;

// The identity adapter: HF keys are the parameter names, layouts are the same.
class HfAdapter {
 public:
  virtual ~HfAdapter() = default;
  // HF key of a parameter.
  virtual std::string hf_key(const std::string& param_name) const { return param_name; }
  // Older HF names the loader also accepts for a parameter when hf_key is absent from the
  // checkpoint (e.g. pre-4.52 transformers prefixes); export keeps whichever scheme the
  // reference directory uses.
  virtual std::vector<std::string> hf_key_aliases(const std::string& param_name) const { return {}; }
  // Whether the parameter's rows are re-laid out between HF and training.
  virtual bool layout_differs(const std::string& param_name) const { return false; }
  // Rows [begin, end) of the parameter in the training layout, read from the HF tensor.
  virtual at::Tensor load_rows(const std::string& param_name, int64_t begin, int64_t end,
                               const HfRowReader& read) const {
    return read(hf_key(param_name), begin, end);
  }
  // The full parameter converted back to the HF layout (the inverse of load_rows).
  virtual at::Tensor to_hf_layout(const std::string& param_name, const at::Tensor& full) const { return full; }
  // How many parameters layout_differs for under this config: loading and export check that they
  // converted exactly that many (a half-converted model must never train or be written).
  virtual int64_t expected_layout_conversions() const { return 0; }
};

}  // namespace mmtrain
