// The engine's test model: a small Llama-style causal LM (RMSNorm, GQA attention with RoPE,
// SwiGLU MLP, untied lm_head). Not a product model: it exists so FSDP, recompute, checkpoints
// and the trainer can be checked against PyTorch (tests/parity/reference_transformer.py is its
// twin, written from the same description), and it is a model like the others: model_id
// "test_transformer" (spec.cpp), trained end to end by the e2e tests, benchmarks and parity tests.
//
// Parameters: embed.weight [V,H]; layers.{i}.{attn_norm,mlp_norm}.weight [H];
// layers.{i}.attn.{wq [nh*hd,H], wk [nkv*hd,H], wv [nkv*hd,H], wo [H,nh*hd]}.weight;
// layers.{i}.mlp.{w1 [F,H], w3 [F,H], w2 [H,F]}.weight; norm.weight [H]; lm_head.weight [V,H].
#pragma once
#include "models/model.h"

namespace mmtrain {

struct TestTransformerConfig {
  int64_t vocab_size = 128;       // V
  int64_t hidden_size = 64;       // H
  int64_t num_layers = 2;         // L
  int64_t num_heads = 4;          // nh; head_dim hd = H / nh
  int64_t num_kv_heads = 2;       // nkv, divides nh (GQA)
  int64_t ffn_hidden_size = 128;  // F
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;

  static TestTransformerConfig from_json(const nlohmann::json& j);
};

std::shared_ptr<Model> make_test_transformer(const nlohmann::json& model_config);

// Forward + backward FLOPs of one sequence of `seqlen` tokens (docs/flops.md's convention):
// matmuls 6 x matmul params x tokens (lm_head included, the embedding lookup not), and causal
// attention 6 x 2 x L x S^2/2 x nh x hd (QK^T and PV, 2 FLOPs per MAC forward, backward 2x).
struct TestTransformerFlops {
  double matmul = 0, attention = 0;
};
TestTransformerFlops test_transformer_flops(const TestTransformerConfig& config, double seqlen);

}  // namespace mmtrain
