#include "models/magihuman/memory.h"

#include <algorithm>

namespace mmtrain::magihuman {

ActivationEstimate magihuman_activation_estimate(const MagiHumanConfig& c, int64_t tokens, int64_t p) {
  const int64_t l = tokens, d = c.hidden_size, hd = c.head_dim, hq = c.num_heads_q(), hkv = c.num_query_groups;
  ActivationEstimate e;
  e.tokens = l;
  e.num_layers = c.num_layers;
  e.q_width = hq * hd;
  e.kv_width = hkv * hd;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    const int64_t u = c.up_gate_rows(layer), i = c.mlp_width(layer);
    const std::vector<std::pair<std::string, int64_t>> saved = {
        {"attention.pre_norm input h fp32 [L,D] + rstd", 4 * l * d + 4 * l},
        {"linear_qkv input (param dtype) [L,D]", p * l * d},
        {"q_norm/k_norm inputs fp32 [L,(Hq+Hkv)hd] + rstd", 4 * l * (hq + hkv) * hd + 4 * l * (hq + hkv)},
        {"attention q,k,v (param dtype) [L,(Hq+2Hkv)hd]", p * l * (hq + 2 * hkv) * hd},
        {"attention out (param dtype) [L,Hq,hd] + logsumexp fp32", p * l * hq * hd + 4 * l * hq},
        {"gate sigmoid fp32 [L,Hq]", c.enable_attn_gating ? 4 * l * hq : 0},
        {"linear_proj input (param dtype) [L,Hq*hd]", p * l * hq * hd},
        {"mlp.pre_norm input fp32 [L,D] + rstd", 4 * l * d + 4 * l},
        {"up_gate_proj input (param dtype) [L,D]", p * l * d},
        {"activation input fp32 [L,U]", 4 * l * u},
        {"down_proj input (param dtype) [L,I]", p * l * i},
    };
    int64_t bytes = 0;
    for (const auto& [name, b] : saved) bytes += b;
    e.layers_full_bytes += bytes;
    e.layer_inputs_bytes += 4 * l * d;  // the fp32 residual stream entering the layer
    if (bytes > e.max_layer_full_bytes) {
      e.max_layer_full_bytes = bytes;
      e.largest_layer = "layer " + std::to_string(layer) + (c.is_gelu7_layer(layer) ? ", GELU7" : ", SwiGLU7");
      e.layer_tensors = saved;
    }
    e.backward_bytes = std::max(e.backward_bytes, 2 * 4 * l * d + 4 * l * u + p * l * u);
  }
  const int64_t io = c.io_width(), out = c.out_width();
  e.outside_bytes = 4 * l * io                 // batch x
                    + 4 * l * out + 4 * l * 9 + 8 * l + l  // target, coords, modality (int64), loss_mask
                    + 4 * l * io               // adapter inputs: per-modality slices of x (upper bound)
                    + 4 * l * c.rope_dims()    // RoPE sin/cos
                    + 8 * l * d                // final norm input + normalized rows
                    + 2 * 4 * l * out;         // output and squared error
  return e;
}

}  // namespace mmtrain::magihuman
