// The test transformer's spec (model_id "test_transformer"): HF keys are its own parameter
// names; its FLOPs are test_transformer_flops (the trainer's and the plan's); no config inference.
#include "models/decoder_activations.h"
#include "models/model_spec.h"
#include "models/test_transformer/model.h"

#include "core/error.h"

namespace mmtrain {
namespace {

// A dense decoder (models/decoder_activations.h has what each layer saves).
ActivationEstimate activations(const ActivationQuery& q) {
  const auto c = TestTransformerConfig::from_json(q.model_config);
  DecoderShape d;
  d.hidden = c.hidden_size;
  d.heads = c.num_heads;
  d.kv_heads = c.num_kv_heads;
  d.head_dim = c.hidden_size / c.num_heads;
  d.ffn = c.ffn_hidden_size;
  d.layers = c.num_layers;
  d.vocab = c.vocab_size;
  return decoder_activation_estimate(d, q.seqlen, q.micro_batch_size, q.param_dtype);
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
  spec.lora_default_targets = {"layers.{*}.attn.wq", "layers.{*}.attn.wk", "layers.{*}.attn.wv", "layers.{*}.attn.wo"};
  spec.lora_supported_targets = {"layers.{*}.attn.w?", "layers.{*}.mlp.w?", "lm_head"};
  return spec;
}

const ModelSpecRegistration registration(test_transformer_spec());

}  // namespace
}  // namespace mmtrain
