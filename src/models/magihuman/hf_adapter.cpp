#include "models/magihuman/hf_adapter.h"

#include "core/error.h"

#include <algorithm>

namespace mmtrain::magihuman {

std::string MagiHumanHfAdapter::hf_key(const std::string& param_name) const {
  static const std::string prefix = "dit.";
  if (param_name.rfind(prefix, 0) != 0) fail("magihuman: parameter '", param_name, "' is outside dit.");
  return param_name.substr(prefix.size());
}

bool MagiHumanHfAdapter::layout_differs(const std::string& param_name) const {
  return c_.deinterleave_mlp && gated_layer_of(param_name) >= 0;
}

int64_t MagiHumanHfAdapter::expected_layout_conversions() const {
  return c_.deinterleave_mlp ? c_.num_gated_layers() : 0;
}

// Training layout of a gated up_gate_proj, per expert block of U = 2I rows: [gate 0..I-1 |
// linear 0..I-1]; on disk row 2j is gate j and row 2j+1 linear j.
at::Tensor MagiHumanHfAdapter::load_rows(const std::string& param_name, int64_t begin, int64_t end,
                                         const HfRowReader& read) const {
  if (!layout_differs(param_name) || begin == end) return read(hf_key(param_name), begin, end);
  const int64_t half = c_.mlp_width(gated_layer_of(param_name));
  std::vector<int64_t> disk_rows;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t block = r / (2 * half), local = r % (2 * half);
    disk_rows.push_back(block * 2 * half + (local < half ? 2 * local : 2 * (local - half) + 1));
  }
  const auto [lo, hi] = std::minmax_element(disk_rows.begin(), disk_rows.end());
  auto span = read(hf_key(param_name), *lo, *hi + 1);
  auto index = at::tensor(disk_rows, at::kLong) - *lo;
  return span.index_select(0, index);
}

at::Tensor MagiHumanHfAdapter::to_hf_layout(const std::string& param_name, const at::Tensor& full) const {
  if (!layout_differs(param_name)) return full;
  const int64_t half = c_.mlp_width(gated_layer_of(param_name));
  const int64_t blocks = full.size(0) / (2 * half);
  return full.reshape({blocks, 2, half, full.size(1)}).transpose(1, 2).reshape(full.sizes());
}

int64_t MagiHumanHfAdapter::gated_layer_of(const std::string& param_name) const {
  static const std::string prefix = "dit.block.layers.", suffix = ".mlp.up_gate_proj.weight";
  if (param_name.rfind(prefix, 0) != 0 || param_name.size() <= prefix.size() + suffix.size() ||
      param_name.compare(param_name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return -1;
  const int64_t layer = std::stoll(param_name.substr(prefix.size(), param_name.size() - prefix.size() - suffix.size()));
  return c_.is_gelu7_layer(layer) ? -1 : layer;
}

}  // namespace mmtrain::magihuman
