#include "models/mistral3/flops.h"

namespace mmtrain::mistral3 {

Mistral3Flops mistral3_flops_terms(const Mistral3Config& c, const std::vector<int64_t>& seqlens,
                                   const std::vector<std::pair<int64_t, int64_t>>& image_sizes) {
  Mistral3Flops f;
  const double H = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  f.text_matmul_params = c.num_layers * (H * q + 2 * H * kv + q * H + 3 * H * c.intermediate_size) +
                         static_cast<double>(c.vocab_size) * H;
  double tokens = 0, causal_keys = 0;  // sum over queries of the keys each attends to
  for (int64_t s : seqlens) {
    tokens += s;
    causal_keys += static_cast<double>(s) * (s + 1) / 2.0;
  }
  f.text_matmul = 6.0 * f.text_matmul_params * tokens;
  f.text_attention = 3.0 * 4.0 * c.num_layers * q * causal_keys;
  const double Dv = c.vision_hidden_size, p = c.patch_size, m = c.spatial_merge_size;
  f.vision_matmul_params = c.vision_num_layers * (4 * Dv * Dv + 3 * Dv * c.vision_intermediate_size) + Dv * c.num_channels * p * p;
  f.projector_matmul_params = Dv * m * m * Dv + Dv * H + H * H;
  f.vision_multiplier = c.freeze_vision ? 1.0 : 3.0;
  for (const auto& [height, width] : image_sizes) {
    const int64_t h = height / c.patch_size, w = width / c.patch_size;
    const double patches = static_cast<double>(h) * w;
    const double merged = static_cast<double>(h / c.spatial_merge_size) * (w / c.spatial_merge_size);
    f.vision_forward += 2.0 * f.vision_matmul_params * patches + 4.0 * c.vision_num_layers * Dv * patches * patches;
    f.projector_forward += 2.0 * f.projector_matmul_params * merged;
  }
  return f;
}

double mistral3_train_flops(const Mistral3Config& c, const std::vector<int64_t>& seqlens,
                            const std::vector<std::pair<int64_t, int64_t>>& image_sizes) {
  return mistral3_flops_terms(c, seqlens, image_sizes).total();
}

}  // namespace mmtrain::mistral3
