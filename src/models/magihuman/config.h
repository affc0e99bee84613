// MagiHuman DiT configuration (upstream inference/common/config.py::ModelConfig). Every
// dimension comes from model.config, so tiny configs keep the real structure: GQA, partial RoPE,
// modality experts, GELU7/SwiGLU7 layers. The tensors it implies are the Module tree of
// make_magihuman (model.h).
//
// Letters: L tokens, D hidden_size, hd head_dim, Hq = D / hd query heads, Hkv kv heads,
// E experts of a layer (3 in mm_layers: video, audio, text; else 1), U up_gate rows per expert
// (2 * I for SwiGLU7, I for GELU7), I MLP width.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>

#include <map>
#include <string>
#include <vector>

namespace mmtrain::magihuman {

enum Modality : int64_t { kVideo = 0, kAudio = 1, kText = 2 };
constexpr int kNumModalities = 3;

struct MagiHumanConfig {
  int64_t num_layers = 40;
  int64_t hidden_size = 5120;          // D
  int64_t head_dim = 128;              // hd
  int64_t num_query_groups = 8;        // Hkv
  int64_t video_in_channels = 192;     // 48 latent channels x (1, 2, 2) patch
  int64_t audio_in_channels = 64;
  int64_t text_in_channels = 3584;
  std::vector<int64_t> mm_layers = {0, 1, 2, 3, 36, 37, 38, 39};
  std::vector<int64_t> gelu7_layers = {0, 1, 2, 3};
  bool enable_attn_gating = true;
  double norm_eps = 1e-6;
  // Gated-MLP layout inside the trainer: true = contiguous [gate | linear] halves per expert
  // (fast: chunk(2)); false = the checkpoint's interleaved rows (gate even, linear odd).
  // Checkpoint files are always interleaved; loading and export convert.
  bool deinterleave_mlp = true;
  bool fused_ops = true;               // fused CPU kernels vs reference ATen ops

  static MagiHumanConfig from_json(const nlohmann::json& j);
  // The config an HF checkpoint was saved with, read off its tensor shapes (HF name -> shape):
  // dimensions from the embedders, q_norm and linear_qkv, mm_layers where attention.pre_norm is
  // 3·hidden wide, gelu7_layers where up_gate rows per expert equal down_proj's input width.
  // Fails naming the tensor when one it needs is missing, or when the model this config builds
  // does not have exactly the checkpoint's names and shapes.
  static MagiHumanConfig infer_from_shapes(const std::map<std::string, std::vector<int64_t>>& shapes);
  nlohmann::json to_json() const;

  int64_t num_heads_q() const { return hidden_size / head_dim; }
  int64_t rope_bands() const { return head_dim / 8; }            // 16 at head_dim 128
  int64_t rope_dims() const { return 6 * rope_bands(); }         // rotated dims: 3/4 of head_dim
  int64_t qkv_width() const { return (num_heads_q() + 2 * num_query_groups) * head_dim + (enable_attn_gating ? num_heads_q() : 0); }
  bool is_mm_layer(int64_t layer) const;
  bool is_gelu7_layer(int64_t layer) const;
  int64_t experts(int64_t layer) const { return is_mm_layer(layer) ? kNumModalities : 1; }
  int64_t mlp_width(int64_t layer) const;     // I
  int64_t up_gate_rows(int64_t layer) const;  // U, per expert
  int64_t io_width() const;                   // x columns: max of the three input widths
  int64_t out_width() const;                  // output columns: max(video, audio)
  int64_t video_latent_channels() const { return video_in_channels / 4; }
  int64_t num_gated_layers() const;           // layers whose MLP is SwiGLU7 (layout transform count)
};

}  // namespace mmtrain::magihuman
