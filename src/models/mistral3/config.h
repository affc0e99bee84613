// Mistral3 (Magistral-Small-2509: Pixtral vision encoder + projector + Mistral LM) dimensions,
// read from model.config in the layout of the HF config.json (docs/mistral3.md):
//
//   model.config:
//     text_config:   {vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
//                     num_key_value_heads, head_dim, intermediate_size, rms_norm_eps,
//                     rope_theta | rope_parameters: {rope_theta, rope_type: default}, hidden_act: silu}
//     vision_config: {hidden_size, num_hidden_layers, num_attention_heads, intermediate_size,
//                     patch_size, image_size, num_channels, hidden_act: silu | gelu,
//                     rope_theta | rope_parameters: {rope_theta}}
//     image_token_index (or image_token_id), spatial_merge_size, projector_hidden_act: gelu,
//     multimodal_projector_bias: false, vision_feature_layer: -1, tie_word_embeddings: false,
//     freeze_vision: true   (mmtrain: vision tower + projector get no grads, no updates)
//     loss_chunk_size: 0    (mmtrain: > 0 = chunked lm_head + cross-entropy, no full logits)
//
// Unknown keys are errors, except HF metadata that does not change the math (model_type,
// architectures, dtype, token ids, max_position_embeddings, ...), which is ignored. Values that
// would change the math and are not implemented (rope scaling, sliding window, tied lm_head,
// projector bias, another vision_feature_layer) fail naming the key.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace mmtrain::mistral3 {

struct Mistral3Config {
  // text (Mistral)
  int64_t vocab_size = 131072;
  int64_t hidden_size = 5120;
  int64_t num_layers = 40;
  int64_t num_heads = 32;
  int64_t num_kv_heads = 8;
  int64_t head_dim = 128;  // explicit, not hidden/heads
  int64_t intermediate_size = 32768;
  double rms_norm_eps = 1e-5;
  double rope_theta = 1.0e9;
  // vision (Pixtral)
  int64_t vision_hidden_size = 1024;
  int64_t vision_num_layers = 24;
  int64_t vision_num_heads = 16;  // head_dim = hidden / heads, as HF (the config's head_dim is ignored)
  int64_t vision_intermediate_size = 4096;
  int64_t patch_size = 14;
  int64_t image_size = 1540;  // max edge; 2D RoPE positions are (row, col) < image_size / patch_size
  int64_t num_channels = 3;
  std::string vision_act = "silu";  // silu | gelu (exact)
  double vision_rope_theta = 10000.0;
  // projector and glue
  int64_t image_token_index = 10;
  int64_t spatial_merge_size = 2;
  bool freeze_vision = true;
  // mmtrain: > 0 computes lm_head + cross-entropy over this many tokens at a time without keeping
  // the [tokens, vocab] logits (nn/chunked_cross_entropy.h; the "logits" output is then absent);
  // 0 = whole logits, as HF.
  int64_t loss_chunk_size = 0;

  int64_t vision_head_dim() const { return vision_hidden_size / vision_num_heads; }

  static Mistral3Config from_json(const nlohmann::json& j);
  // HF's config.json for this model, every value written out: Mistral3ForConditionalGeneration
  // built from it computes what this config does (from_json reads it back to the same config).
  nlohmann::json to_hf_json() const;
};

}  // namespace mmtrain::mistral3
