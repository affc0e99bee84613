// Mistral3 (Magistral) model FLOPs of forward + backward for samples of lengths seqlens, with
// causal text attention counted exactly and the vision tower counted once per image:
//   text      6 * matmul params (layers + lm_head) * tokens + 3 * 4 * layers * q_dim * Σ_s s(s+1)/2
//   per image (H, W), P = (H/p)(W/p) patches, M = (H/p/m)(W/p/m) merged tokens:
//   vision    2 * matmul params * P + 4 * layers * Dv * P² (full attention inside the image)
//   projector 2 * matmul params * M
// vision and projector count x1 when freeze_vision (forward only), else x3. The embedding is a
// lookup: 0 FLOPs. S = 2048 unpacked gives 139.4 GFLOP per token for Magistral-Small-2509.
#pragma once
#include "models/mistral3/config.h"

#include <cstdint>
#include <utility>
#include <vector>

namespace mmtrain::mistral3 {

struct Mistral3Flops {
  double text_matmul_params = 0;       // layers + lm_head
  double vision_matmul_params = 0;     // patch_conv + layers
  double projector_matmul_params = 0;  // merging_layer + linear_1 + linear_2
  double text_matmul = 0;              // forward + backward
  double text_attention = 0;           // forward + backward, causal
  double vision_forward = 0;           // all images: matmuls + attention inside each image
  double projector_forward = 0;
  double vision_multiplier = 1;        // 1 when freeze_vision (forward only), else 3
  double total() const {
    return text_matmul + text_attention + vision_multiplier * (vision_forward + projector_forward);
  }
};
Mistral3Flops mistral3_flops_terms(const Mistral3Config& c, const std::vector<int64_t>& seqlens,
                                   const std::vector<std::pair<int64_t, int64_t>>& image_sizes);
double mistral3_train_flops(const Mistral3Config& c, const std::vector<int64_t>& seqlens,
                            const std::vector<std::pair<int64_t, int64_t>>& image_sizes);

}  // namespace mmtrain::mistral3
