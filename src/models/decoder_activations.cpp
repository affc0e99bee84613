#include "models/decoder_activations.h"

#include <algorithm>

namespace mmtrain {

ActivationEstimate decoder_activation_estimate(const DecoderShape& d, int64_t seqlen, int64_t micro_batch_size,
                                               at::ScalarType dtype) {
  const int64_t t = seqlen * micro_batch_size, e = static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t h = d.hidden, hd = d.head_dim, f = d.ffn;
  ActivationEstimate a;
  a.tokens = t;
  a.num_layers = d.layers;
  a.q_width = d.heads * hd;
  a.kv_width = d.kv_heads * hd;
  a.layer_tensors = {{"attn_norm input, normalized, output", 3 * t * h * e + 4 * t},
                     {"attention q,k,v,out + logsumexp", t * (2 * d.heads + 2 * d.kv_heads) * hd * e + 4 * t * d.heads},
                     {"o_proj input", t * d.heads * hd * e},
                     {"mlp_norm input, normalized, output", 3 * t * h * e + 4 * t},
                     {"swiglu gate x, silu, up x, product", 4 * t * f * e}};
  for (const auto& [name, bytes] : a.layer_tensors) a.max_layer_full_bytes += bytes;
  a.largest_layer = "layers.0";
  a.layers_full_bytes = d.layers * a.max_layer_full_bytes;
  a.layer_inputs_bytes = d.layers * t * h * e;
  const int64_t logits_tokens = d.loss_chunk > 0 ? std::min(d.loss_chunk, t) : t;
  a.outside_bytes = 3 * t * h * e + logits_tokens * d.vocab * (e + 2 * 4) + 8 * (t + micro_batch_size);
  a.backward_bytes = 2 * t * h * e + 2 * t * f * e;
  return a;
}

}  // namespace mmtrain
