// The test transformer's spec (model_id "test_transformer"): HF keys are its own parameter
// names; its FLOPs are test_transformer_flops (the trainer's and the plan's); no config inference.
#include "models/model_spec.h"
#include "models/test_transformer/model.h"

#include "core/error.h"

namespace mmtrain {
namespace {

// What autograd saves for one micro-batch of B x S tokens (T = B*S, e = bytes of the compute
// dtype, which is the gathered params' dtype), following the composite ops of nn/ops.cpp:
//   rms_norm       input, normalized (e), output read by the next linears (e): 3 T H e (+ rstd)
//   attention      q, k, v after RoPE, out (e) and logsumexp (fp32): T (2 nh + 2 nkv) hd e + 4 T nh
//   wo             input (the reshaped attention output): T nh hd e
//   swiglu MLP     w1 x, silu(w1 x), w3 x, their product: 4 T F e
// Recompute keeps the layer input x (T H e). Outside: final norm (3 T H e), logits (T V e) and
// the fp32 copy and log-softmax of the loss (2 T V 4). Backward: residual grads in and out
// (2 T H e) and two MLP-wide grads (2 T F e). An estimate: it ignores allocator rounding.
ActivationEstimate activations(const ActivationQuery& q) {
  const auto c = TestTransformerConfig::from_json(q.model_config);
  const int64_t t = q.seqlen * q.micro_batch_size, e = static_cast<int64_t>(c10::elementSize(q.param_dtype));
  const int64_t hd = c.hidden_size / c.num_heads, h = c.hidden_size, f = c.ffn_hidden_size;
  ActivationEstimate a;
  a.tokens = t;
  a.num_layers = c.num_layers;
  a.q_width = c.num_heads * hd;
  a.kv_width = c.num_kv_heads * hd;
  a.layer_tensors = {{"attn_norm input, normalized, output", 3 * t * h * e + 4 * t},
                     {"attention q,k,v,out + logsumexp", t * (2 * c.num_heads + 2 * c.num_kv_heads) * hd * e + 4 * t * c.num_heads},
                     {"wo input", t * c.num_heads * hd * e},
                     {"mlp_norm input, normalized, output", 3 * t * h * e + 4 * t},
                     {"swiglu w1 x, silu, w3 x, product", 4 * t * f * e}};
  for (const auto& [name, bytes] : a.layer_tensors) a.max_layer_full_bytes += bytes;
  a.largest_layer = "layers.0";
  a.layers_full_bytes = c.num_layers * a.max_layer_full_bytes;
  a.layer_inputs_bytes = c.num_layers * t * h * e;
  a.outside_bytes = 3 * t * h * e + t * c.vocab_size * e + 2 * t * c.vocab_size * 4 + 8 * (t + q.micro_batch_size);
  a.backward_bytes = 2 * t * h * e + 2 * t * f * e;
  return a;
}

FlopsReport flops(const nlohmann::json& model_config, const FlopsQuery& q) {
  const auto c = TestTransformerConfig::from_json(model_config);
  if (q.seqlens.empty()) fail("flops test_transformer: no sequence lengths");
  FlopsReport r;
  r.title = "test transformer FLOPs (docs/flops.md)";
  double matmul = 0, attention = 0;
  for (int64_t s : q.seqlens) {
    const auto f = test_transformer_flops(c, static_cast<double>(s));
    matmul += f.matmul;
    attention += f.attention;
  }
  const double n = static_cast<double>(q.seqlens.size());
  r.fields = {{"matmul_flops_per_sample", matmul / n}, {"attention_flops_per_sample", attention / n}};
  r.flops_per_sample = (matmul + attention) / n;
  r.attention_flops_per_sample = attention / n;
  return r;
}

ModelSpec test_transformer_spec() {
  ModelSpec spec;
  spec.name = "test_transformer";
  spec.title = "test transformer (the engine's test model)";
  spec.build = make_test_transformer;
  spec.activations = activations;
  spec.flops = flops;
  return spec;
}

const ModelSpecRegistration registration(test_transformer_spec());

}  // namespace
}  // namespace mmtrain
