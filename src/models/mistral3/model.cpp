// Mistral3 forward and loss as HF transformers' Mistral3ForConditionalGeneration
// (docs/mistral3.md). Precision follows HF: activations in the parameter dtype, RMSNorm in fp32
// then cast back before the weight multiply, RoPE tables in fp32 cast to the activation dtype,
// logits upcast to fp32 for the loss.
#include "models/mistral3/model.h"

#include "core/error.h"
#include "models/incremental_decoder.h"
#include "models/mistral3/flops.h"
#include "nn/attention.h"
#include "nn/chunked_cross_entropy.h"
#include "nn/layers.h"
#include "nn/ops.h"
#include "nn/sequence_split.h"

#include <ATen/core/Reduction.h>

#include <optional>
#include <tuple>

namespace mmtrain::mistral3 {
namespace {

// Magistral's public checkpoint stores every tensor in bf16; its RMSNorm gains start at 1.
std::shared_ptr<Linear> linear_layer(int64_t out, int64_t in) { return std::make_shared<Linear>(out, in, at::kBFloat16); }
std::shared_ptr<Norm> norm_layer(int64_t width) { return std::make_shared<Norm>(width, at::kBFloat16, NormInit::one); }

at::Tensor lin(const at::Tensor& x, const std::shared_ptr<Linear>& w) { return w->forward(x); }

// q/k/v/o projections under one parent, named as HF.
class Projections : public Module {
 public:
  Projections(int64_t hidden, int64_t q_dim, int64_t kv_dim) {
    q_proj = add_child("q_proj", linear_layer(q_dim, hidden));
    k_proj = add_child("k_proj", linear_layer(kv_dim, hidden));
    v_proj = add_child("v_proj", linear_layer(kv_dim, hidden));
    o_proj = add_child("o_proj", linear_layer(hidden, q_dim));
  }
  std::shared_ptr<Linear> q_proj, k_proj, v_proj, o_proj;
};

class GatedMlp : public Module {
 public:
  GatedMlp(int64_t hidden, int64_t intermediate) {
    gate_proj = add_child("gate_proj", linear_layer(intermediate, hidden));
    up_proj = add_child("up_proj", linear_layer(intermediate, hidden));
    down_proj = add_child("down_proj", linear_layer(hidden, intermediate));
  }
  // down(act(gate x) * up x), act = silu or exact gelu
  at::Tensor forward(const at::Tensor& x, bool silu) const {
    auto g = lin(x, gate_proj);
    return lin(silu ? silu_mul(g, lin(x, up_proj)) : at::gelu(g) * lin(x, up_proj), down_proj);
  }
  std::shared_ptr<Linear> gate_proj, up_proj, down_proj;
};

// ---------------------------------------------------------------------------------- vision

constexpr double kVisionEps = 1e-5;  // hard-coded in Pixtral (attention_norm, ffn_norm, ln_pre)

class VisionLayer : public Module {
 public:
  explicit VisionLayer(const Mistral3Config& c) : c_(c) {
    attention_norm = add_child("attention_norm", norm_layer(c.vision_hidden_size));
    attention = add_child("attention", std::make_shared<Projections>(c.vision_hidden_size, c.vision_hidden_size,
                                                                      c.vision_hidden_size));
    ffn_norm = add_child("ffn_norm", norm_layer(c.vision_hidden_size));
    feed_forward = add_child("feed_forward", std::make_shared<GatedMlp>(c.vision_hidden_size, c.vision_intermediate_size));
    mark_block();
  }

  // x [P, D]; cos/sin [P, hd]; patches[i] = patch count of image i (x holds them in order).
  // Attention is full inside each image and absent across images (block-diagonal).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& patches) const {
    const int64_t P = x.size(0), nh = c_.vision_num_heads, hd = c_.vision_head_dim();
    auto n1 = rms_norm(x, attention_norm->weight.value, kVisionEps);
    auto q = apply_rope(lin(n1, attention->q_proj).view({P, nh, hd}), cos, sin);
    auto k = apply_rope(lin(n1, attention->k_proj).view({P, nh, hd}), cos, sin);
    auto v = lin(n1, attention->v_proj).view({P, nh, hd});
    // Every rank runs the whole tower: vision attention never touches a context-parallel group.
    std::vector<int64_t> cu_patches = {0};
    for (int64_t n : patches) cu_patches.push_back(cu_patches.back() + n);
    auto attn = varlen_attention(q, k, v, cu_patches, /*causal=*/false).out.reshape({P, nh * hd});
    auto h = x + lin(attn, attention->o_proj);
    return h + feed_forward->forward(rms_norm(h, ffn_norm->weight.value, kVisionEps), c_.vision_act == "silu");
  }

  std::shared_ptr<Norm> attention_norm, ffn_norm;
  std::shared_ptr<Projections> attention;
  std::shared_ptr<GatedMlp> feed_forward;

 private:
  Mistral3Config c_;
};

class VisionTower : public Module {
 public:
  explicit VisionTower(const Mistral3Config& c) {
    patch_conv = add_child("patch_conv", std::make_shared<Weight>(std::vector<int64_t>{c.vision_hidden_size, c.num_channels,
                                                                                    c.patch_size, c.patch_size},
                                                                at::kBFloat16));
    ln_pre = add_child("ln_pre", norm_layer(c.vision_hidden_size));
    auto transformer = add_child("transformer", std::make_shared<ModuleGroup>());
    auto layer_list = transformer->add_child("layers", std::make_shared<ModuleGroup>());
    for (int64_t i = 0; i < c.vision_num_layers; ++i)
      layers.push_back(layer_list->add_child(std::to_string(i), std::make_shared<VisionLayer>(c)));
  }
  std::shared_ptr<Weight> patch_conv;
  std::shared_ptr<Norm> ln_pre;
  std::vector<std::shared_ptr<VisionLayer>> layers;
};

// Pixtral's axial 2D RoPE for a patch at (row, col): with f = theta^(-2j/hd), j < hd/2, the
// angles are [row * f[0::2], col * f[1::2]] (hd/2), repeated twice (rotate-half layout).
std::pair<at::Tensor, at::Tensor> vision_rope(const std::vector<std::pair<int64_t, int64_t>>& grids, int64_t head_dim,
                                              double theta, at::Device device) {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  std::vector<at::Tensor> rows, cols;
  for (const auto& [h, w] : grids) {
    auto r = at::arange(h, longs).view({h, 1}).expand({h, w}).reshape(-1);
    auto c = at::arange(w, longs).view({1, w}).expand({h, w}).reshape(-1);
    rows.push_back(r);
    cols.push_back(c);
  }
  auto exponents = at::arange(0, head_dim, 2, longs).to(at::kFloat) / static_cast<double>(head_dim);
  auto inv_freq = 1.0 / at::pow(theta, exponents);  // [hd/2]
  auto even = inv_freq.slice(0, 0, inv_freq.size(0), 2), odd = inv_freq.slice(0, 1, inv_freq.size(0), 2);
  auto ang = at::cat({at::cat(rows).to(at::kFloat).unsqueeze(1) * even, at::cat(cols).to(at::kFloat).unsqueeze(1) * odd}, 1);
  auto emb = at::cat({ang, ang}, 1);  // [P, hd]
  return {emb.cos(), emb.sin()};
}

// -------------------------------------------------------------------------------- projector

class PatchMerger : public Module {
 public:
  explicit PatchMerger(const Mistral3Config& c) {
    const int64_t m = c.spatial_merge_size;
    merging_layer = add_child("merging_layer", linear_layer(c.vision_hidden_size, c.vision_hidden_size * m * m));
  }
  std::shared_ptr<Linear> merging_layer;
};

class Projector : public Module {
 public:
  explicit Projector(const Mistral3Config& c) {
    norm = add_child("norm", norm_layer(c.vision_hidden_size));
    patch_merger = add_child("patch_merger", std::make_shared<PatchMerger>(c));
    linear_1 = add_child("linear_1", linear_layer(c.hidden_size, c.vision_hidden_size));
    linear_2 = add_child("linear_2", linear_layer(c.hidden_size, c.hidden_size));
  }
  std::shared_ptr<Norm> norm;
  std::shared_ptr<Linear> linear_1, linear_2;
  std::shared_ptr<PatchMerger> patch_merger;
};

// ------------------------------------------------------------------------------------- text

class TextLayer : public Module {
 public:
  explicit TextLayer(const Mistral3Config& c) : c_(c) {
    input_layernorm = add_child("input_layernorm", norm_layer(c.hidden_size));
    self_attn = add_child("self_attn", std::make_shared<Projections>(c.hidden_size, c.num_heads * c.head_dim,
                                                                      c.num_kv_heads * c.head_dim));
    post_attention_layernorm = add_child("post_attention_layernorm", norm_layer(c.hidden_size));
    mlp = add_child("mlp", std::make_shared<GatedMlp>(c.hidden_size, c.intermediate_size));
    mark_block();
  }

  // x [T, H], one packed stream (the batch's rows, or its packed samples); cos/sin [T, hd];
  // causal GQA attention within each sample of seq, over the CP ranks when it is split.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, const SequenceSplit& seq) const {
    const int64_t T = x.size(0), nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
    auto n1 = rms_norm(x, input_layernorm->weight.value, c_.rms_norm_eps);
    auto q = apply_rope(lin(n1, self_attn->q_proj).view({T, nh, hd}), cos, sin);
    auto k = apply_rope(lin(n1, self_attn->k_proj).view({T, nkv, hd}), cos, sin);
    auto v = lin(n1, self_attn->v_proj).view({T, nkv, hd});
    auto o = seq.attention(q, k, v, /*causal=*/true);  // [T, nh, hd]
    auto h = x + lin(o.reshape({T, nh * hd}), self_attn->o_proj);
    return h + mlp->forward(rms_norm(h, post_attention_layernorm->weight.value, c_.rms_norm_eps), /*silu=*/true);
  }

  // Generation: x [T, H] the new tokens, at positions keys.size(0) onwards; their keys and values
  // are appended to the layer's cache (keys/values [length, kv_heads, hd], undefined when empty).
  // Each new token attends causally to every cached position and to the new ones up to itself.
  at::Tensor forward_cached(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys,
                            at::Tensor& values) const {
    const int64_t T = x.size(0), nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
    auto [q, k, v] = new_queries_keys_values(x, cos, sin);
    keys = keys.defined() ? at::cat({keys, k}) : k;
    values = values.defined() ? at::cat({values, v}) : v;
    const int64_t L = keys.size(0), group = nh / nkv;
    auto key_heads = keys.repeat_interleave(group, 1).transpose(0, 1);  // [nh, L, hd]
    auto value_heads = values.repeat_interleave(group, 1).transpose(0, 1);
    std::optional<at::Tensor> mask;
    if (T > 1) {  // query i sits at position L - T + i: it sees keys 0 .. L - T + i
      auto rows = at::arange(L - T, L, at::TensorOptions().dtype(at::kLong).device(x.device())).unsqueeze(1);
      mask = at::arange(L, rows.options()).unsqueeze(0) <= rows;
    }
    auto o = at::scaled_dot_product_attention(q.transpose(0, 1), key_heads, value_heads, mask);  // [nh, T, hd]
    return output_and_mlp(x, o.transpose(0, 1).reshape({T, nh * hd}));
  }

  // forward_cached for B sequences of one new token each, at one position: x [B, H], cos / sin
  // [B, hd] (the position's row, repeated), keys / values [B, L, kv_heads, hd] grown by one. Each
  // row is the single-sequence path's arithmetic (the same kernels, row by row).
  at::Tensor forward_cached_batch(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& keys,
                                  at::Tensor& values) const {
    const int64_t B = x.size(0), nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
    auto [q, k, v] = new_queries_keys_values(x, cos, sin);
    keys = at::cat({keys, k.unsqueeze(1)}, 1);
    values = at::cat({values, v.unsqueeze(1)}, 1);
    const int64_t group = nh / nkv;
    auto key_heads = keys.repeat_interleave(group, 2).transpose(1, 2);  // [B, nh, L, hd]
    auto value_heads = values.repeat_interleave(group, 2).transpose(1, 2);
    auto o = at::scaled_dot_product_attention(q.unsqueeze(2), key_heads, value_heads);  // [B, nh, 1, hd]
    return output_and_mlp(x, o.reshape({B, nh * hd}));
  }

  std::shared_ptr<Norm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<Projections> self_attn;
  std::shared_ptr<GatedMlp> mlp;

 private:
  // Generation's two ends, shared by both cached paths (N new rows: T tokens, or B sequences):
  // x [N, H] -> rotated q [N, nh, hd], rotated k and v [N, kv_heads, hd]; and the attention's
  // output [N, nh * hd] through o_proj, the residual and the MLP block.
  std::tuple<at::Tensor, at::Tensor, at::Tensor> new_queries_keys_values(const at::Tensor& x, const at::Tensor& cos,
                                                                          const at::Tensor& sin) const {
    const int64_t N = x.size(0), nh = c_.num_heads, nkv = c_.num_kv_heads, hd = c_.head_dim;
    auto n1 = rms_norm(x, input_layernorm->weight.value, c_.rms_norm_eps);
    auto q = apply_rope(lin(n1, self_attn->q_proj).view({N, nh, hd}), cos, sin);
    auto k = apply_rope(lin(n1, self_attn->k_proj).view({N, nkv, hd}), cos, sin);
    return {q, k, lin(n1, self_attn->v_proj).view({N, nkv, hd})};
  }
  at::Tensor output_and_mlp(const at::Tensor& x, const at::Tensor& attended) const {
    auto h = x + lin(attended, self_attn->o_proj);
    return h + mlp->forward(rms_norm(h, post_attention_layernorm->weight.value, c_.rms_norm_eps), /*silu=*/true);
  }

  Mistral3Config c_;
};

class Mistral3Model : public Model, public SplitsSequence, public IncrementalDecoder {
 public:
  explicit Mistral3Model(const Mistral3Config& config) : c_(config) {
    const auto& c = c_;
    // HF module order (vision, projector, text): FSDP units follow it, so forward prefetch does too.
    auto model = add_child("model", std::make_shared<ModuleGroup>());
    vision = model->add_child("vision_tower", std::make_shared<VisionTower>(c));
    projector = model->add_child("multi_modal_projector", std::make_shared<Projector>(c));
    auto text = model->add_child("language_model", std::make_shared<ModuleGroup>());
    embed_tokens = text->add_child("embed_tokens", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, at::kBFloat16));
    auto layer_list = text->add_child("layers", std::make_shared<ModuleGroup>());
    for (int64_t i = 0; i < c.num_layers; ++i)
      layers.push_back(layer_list->add_child(std::to_string(i), std::make_shared<TextLayer>(c)));
    norm = text->add_child("norm", norm_layer(c.hidden_size));
    lm_head = add_child("lm_head", linear_layer(c.vocab_size, c.hidden_size));
    if (c.freeze_vision) {
      for (auto& [name, p] : vision->named_parameters()) p->requires_grad = false;
      for (auto& [name, p] : projector->named_parameters()) p->requires_grad = false;
    }
  }

  ModelOutput forward(const Batch& batch) override {
    const auto& c = c_;
    const auto& input_ids = batch_get(batch, "input_ids");
    const auto& labels = batch_get(batch, "labels");
    if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong)
      fail("batch 'input_ids' must be int64 [B, S], got ", input_ids.scalar_type(), " ", input_ids.sizes());
    if (labels.sizes() != input_ids.sizes())
      fail("batch 'labels' must be [B, S] = ", input_ids.sizes(), ", got ", labels.sizes());
    const int64_t B = input_ids.size(0), S = input_ids.size(1);
    std::vector<int64_t> seq_begins;  // packed samples of the single row; empty: one sample per row
    if (auto it = batch.find("cu_seqlens"); it != batch.end()) {
      if (B != 1) fail("batch 'cu_seqlens' needs input_ids [1, S] (packed), got input_ids ", input_ids.sizes());
      seq_begins = cu_seqlens_from(it->second, S, "batch 'cu_seqlens'");
      for (size_t i = 1; i < seq_begins.size(); ++i)
        if (seq_begins[i] == seq_begins[i - 1]) fail("batch 'cu_seqlens': packed sample ", i - 1, " is empty");
    }
    at::Tensor positions;
    if (auto it = batch.find("position_ids"); it != batch.end()) {
      positions = it->second;
      if (positions.sizes() != input_ids.sizes())
        fail("batch 'position_ids' must be [B, S] = ", input_ids.sizes(), ", got ", positions.sizes());
    } else if (!seq_begins.empty()) {  // positions restart in every packed sample
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i + 1 < seq_begins.size(); ++i) parts.push_back(at::arange(seq_begins[i + 1] - seq_begins[i], input_ids.options()));
      positions = at::cat(parts).unsqueeze(0);
    } else {
      positions = at::arange(S, input_ids.options()).unsqueeze(0).expand({B, S});
    }

    ModelOutput result;
    auto embeds = input_embeddings(batch, input_ids, result);  // [B, S, H]

    // The LM runs over one packed stream of T = B * S rows: the batch's rows are its samples
    // (right padding sits after every real token of its row, so causal attention keeps it out of
    // them), or the packed samples at cu_seqlens. Under context parallelism the stream is split
    // here, after the image features are in the embeddings; the positions were made for the
    // whole stream, and the labels are shifted within each row before they are split with it.
    std::vector<int64_t> stream = seq_begins;
    if (stream.empty())
      for (int64_t b = 0; b <= B; ++b) stream.push_back(b * S);
    const auto seq = split_sequence(stream, /*causal=*/true);
    const int64_t T = B * S;
    auto h = seq->take(embeds.reshape({T, c.hidden_size}));

    // RoPE tables in fp32, [T_loc, hd]; cast to the activation dtype in apply_rope.
    const auto [cos, sin] = rope_tables(seq->take(positions.reshape({T})), c.head_dim, c.rope_theta);

    for (auto& layer : layers) {
      auto layer_ptr = layer;  // may run again in backward (recompute): capture by value
      h = layer->apply({h, cos, sin}, [layer_ptr, seq](const std::vector<at::Tensor>& in) {
        return layer_ptr->forward(in[0], in[1], in[2], *seq);
      });
    }
    h = rms_norm(h, norm->weight.value, c.rms_norm_eps);
    result.tokens = h.size(0);
    if (batch.count(kSequenceLogProbsKey)) {
      if (seq->is_split())
        fail("batch '", kSequenceLogProbsKey, "': per-sequence log-probs under context parallelism are not implemented "
             "(a preference objective needs parallel.context_parallel_size 1 for mistral3)");
      sequence_log_probs(h, labels, stream, result);
      return result;
    }
    if (auto it = batch.find(kTokenLogProbsKey); it != batch.end()) {
      if (seq->is_split())
        fail("batch '", kTokenLogProbsKey, "': per-token log-probs under context parallelism are not implemented "
             "(GRPO needs parallel.ring_attention_size and ulysses_parallel_size 1 for mistral3)");
      const auto shifted = next_token_labels(labels);
      const double temperature = it->second.item<double>();
      const int64_t chunk = c_.loss_chunk_size > 0 ? c_.loss_chunk_size : h.size(0);
      result.token_log_probs = chunked_linear_log_probs(h, lm_head->weight.value, shifted, chunk, -100, temperature);
      result.token_entropies = chunked_linear_entropy(h, lm_head->weight.value, shifted, chunk, -100, temperature);
      return result;
    }
    // A token-budget step divides by the supervised tokens of its whole global batch.
    const std::optional<double> normalizer = loss_normalizer(batch, 0);
    if (seq->is_split()) {
      result.loss = split_loss(h, labels, *seq, normalizer);
      return result;
    }
    h = h.view({B, S, c.hidden_size});

    // HF ForCausalLMLoss: position t predicts labels[t + 1]; mean over supervised tokens.
    auto shift_labels = labels.narrow(1, 1, S - 1).reshape({-1}).to(at::kLong);
    if (c.loss_chunk_size > 0) {
      auto shift_h = h.narrow(1, 0, S - 1).reshape({-1, c.hidden_size});
      result.loss = chunked_linear_cross_entropy(shift_h, lm_head->weight.value, shift_labels, c.loss_chunk_size, -100,
                                                 normalizer.value_or(0.0));
      return result;
    }
    auto logits = lin(h, lm_head).to(at::kFloat);  // [B, S, V]
    auto shift_logits = logits.narrow(1, 0, S - 1).reshape({-1, c.vocab_size});
    const int64_t supervised = (shift_labels != -100).sum().item<int64_t>();
    if (supervised == 0) {
      result.loss = logits.sum() * 0.0;  // nothing supervised: zero loss and grads
    } else if (normalizer) {
      result.loss = at::cross_entropy_loss(shift_logits, shift_labels, {}, at::Reduction::Sum, -100) / *normalizer;
    } else {
      result.loss = at::cross_entropy_loss(shift_logits, shift_labels, {}, at::Reduction::Mean, -100);
    }
    result.tensors["logits"] = logits;
    return result;
  }

  at::Tensor prefill(const Batch& prompt, Cache& cache) override {
    const auto& input_ids = batch_get(prompt, "input_ids");
    if (input_ids.dim() != 2 || input_ids.size(0) != 1 || input_ids.scalar_type() != at::kLong)
      fail("mistral3 prefill: input_ids must be int64 [1, S], got ", input_ids.scalar_type(), " ", input_ids.sizes());
    cache = Cache{std::vector<at::Tensor>(layers.size()), std::vector<at::Tensor>(layers.size()), 0};
    ModelOutput discard;
    const auto embeds = input_embeddings(prompt, input_ids, discard);
    return run_cached(embeds[0], cache);
  }

  at::Tensor decode(int64_t token, Cache& cache) override {
    if (token < 0 || token >= c_.vocab_size) fail("mistral3 decode: token ", token, " outside the vocabulary");
    const auto ids = at::full({1, 1}, token, at::TensorOptions().dtype(at::kLong).device(embed_tokens->weight.value.device()));
    return run_cached(at::embedding(embed_tokens->weight.value, ids)[0], cache);
  }

  at::Tensor decode_batch(const std::vector<int64_t>& tokens, Cache& cache) override {
    const int64_t B = static_cast<int64_t>(tokens.size());
    for (const int64_t token : tokens)
      if (token < 0 || token >= c_.vocab_size) fail("mistral3 decode: token ", token, " outside the vocabulary");
    const auto device = embed_tokens->weight.value.device();
    auto h = at::embedding(embed_tokens->weight.value, at::tensor(tokens, at::kLong).to(device));  // [B, H]
    auto [cos, sin] = rope_tables(at::full({1}, cache.length, at::TensorOptions().dtype(at::kLong).device(device)),
                                  c_.head_dim, c_.rope_theta);
    cos = cos.expand({B, c_.head_dim}).contiguous();
    sin = sin.expand({B, c_.head_dim}).contiguous();
    for (size_t i = 0; i < layers.size(); ++i) {
      auto layer_ptr = layers[i];
      at::Tensor& keys = cache.keys[i];
      at::Tensor& values = cache.values[i];
      h = layers[i]->apply({h, cos, sin}, [layer_ptr, &keys, &values](const std::vector<at::Tensor>& in) {
        return layer_ptr->forward_cached_batch(in[0], in[1], in[2], keys, values);
      });
    }
    cache.length += 1;
    return lin(rms_norm(h, norm->weight.value, c_.rms_norm_eps), lm_head).to(at::kFloat);  // [B, V]
  }

  // The label each row of the stream predicts, int64 [B x S]: labels [B, S] shifted left by one
  // within each row, -100 at a row's end.
  static at::Tensor next_token_labels(const at::Tensor& labels) {
    const int64_t B = labels.size(0), S = labels.size(1);
    return at::cat({labels.narrow(1, 1, S - 1), at::full({B, 1}, -100, labels.options())}, 1).reshape({B * S}).to(at::kLong);
  }

  // Each sequence's Σ log p(label) over its supervised tokens (models/model.h): h [T, H] the
  // whole stream, labels [B, S], stream its sequences' begins (rows or packed samples). Position t
  // predicts labels[t + 1] within its row; a packed sample's first label is -100, so no position
  // scores the next sample's first token.
  void sequence_log_probs(const at::Tensor& h, const at::Tensor& labels, const std::vector<int64_t>& stream,
                          ModelOutput& result) const {
    const int64_t T = labels.numel();
    const auto shifted = next_token_labels(labels);
    const int64_t chunk = c_.loss_chunk_size > 0 ? c_.loss_chunk_size : T;
    const auto token_log_probs = chunked_linear_log_probs(h, lm_head->weight.value, shifted, chunk, -100);  // [T]
    const int64_t sequences = static_cast<int64_t>(stream.size()) - 1;
    if (stream.back() != T) fail("batch 'cu_seqlens' ends at ", stream.back(), ", not at the row's ", T, " tokens");
    const auto index = sequence_of_rows(stream, h.device());
    result.sequence_log_probs =
        at::zeros({sequences}, token_log_probs.options()).index_add(0, index, token_log_probs);
    result.sequence_tokens =
        at::zeros({sequences}, token_log_probs.options()).index_add(0, index, (shifted != -100).to(at::kFloat));
  }

  // The loss over a split stream: local h [T_loc, H], labels [B, S] of the whole batch. Each rank
  // sums the cross-entropy of its supervised rows over the count of all CP ranks' supervised rows;
  // the CP sum of those is the unsplit mean on every rank.
  at::Tensor split_loss(const at::Tensor& h, const at::Tensor& labels, const SequenceSplit& seq,
                        std::optional<double> normalizer) const {
    const int64_t B = labels.size(0), S = labels.size(1);
    auto shifted = at::cat({labels.narrow(1, 1, S - 1), at::full({B, 1}, -100, labels.options())}, 1);
    const auto local_labels = seq.take(shifted.reshape({B * S}).to(at::kLong), -100);
    const int64_t supervised = seq.sum((local_labels != -100).sum().item<int64_t>());
    // Every rank runs the whole backward (its attention sends gradients to the other ranks),
    // even when none of its rows is supervised.
    auto touch = h.sum() * 0.0;
    if (supervised == 0) return touch;
    const double divisor = normalizer.value_or(static_cast<double>(supervised));
    at::Tensor partial;
    if (c_.loss_chunk_size > 0) {
      partial = chunked_linear_cross_entropy(h, lm_head->weight.value, local_labels, c_.loss_chunk_size, -100, divisor);
    } else {
      auto logits = lin(h, lm_head).to(at::kFloat);
      partial = at::cross_entropy_loss(logits, local_labels, {}, at::Reduction::Sum, -100) / divisor;
    }
    return seq.sum(partial) + touch.to(at::kFloat);
  }

  // What a Ulysses split of the text heads must divide. The vision tower is not split (every CP
  // rank runs it whole).
  std::vector<AttentionHeads> attention_heads() const override {
    return {{c_.num_heads, c_.num_kv_heads, "model.config.text_config.num_attention_heads",
             "model.config.text_config.num_key_value_heads"}};
  }

  // Supervised tokens: labels[:, 1:] that are not -100 (what the loss's mean divides by).
  std::vector<double> loss_counts(const Batch& batch) const override {
    const auto& labels = batch_get(batch, "labels");
    return {static_cast<double>((labels.narrow(1, 1, labels.size(1) - 1) != -100).sum().item<int64_t>())};
  }

  double train_flops(const Batch& batch) const override {
    const auto& ids = batch_get(batch, "input_ids");
    std::vector<std::pair<int64_t, int64_t>> image_hw;
    if (auto it = batch.find("pixel_values"); it != batch.end() && it->second.size(0) > 0) {
      const auto sizes = batch_get(batch, "image_sizes").to(at::kLong).contiguous();
      for (int64_t i = 0; i < sizes.size(0); ++i)
        image_hw.emplace_back(sizes[i][0].item<int64_t>(), sizes[i][1].item<int64_t>());
    }
    std::vector<int64_t> seqlens;
    if (auto it = batch.find("cu_seqlens"); it != batch.end()) {
      auto cu = it->second.to(at::kLong).contiguous();
      for (int64_t i = 0; i + 1 < cu.numel(); ++i) seqlens.push_back(cu[i + 1].item<int64_t>() - cu[i].item<int64_t>());
    } else if (auto mask = batch.find("attention_mask"); mask != batch.end()) {
      // Padded rows (pixtral collator): count each row's real tokens, not its padding.
      auto lengths = (mask->second != 0).sum(1).to(at::kCPU).to(at::kLong).contiguous();
      seqlens.assign(lengths.data_ptr<int64_t>(), lengths.data_ptr<int64_t>() + lengths.numel());
    } else {
      seqlens.assign(ids.size(0), ids.size(1));
    }
    // Model FLOPs count the sample once; under context parallelism each CP rank reports its
    // 1/cp share (the vision tower, which every CP rank runs whole, included).
    const double flops = mistral3_train_flops(c_, seqlens, image_hw);
    return rank_share(flops);
  }

 private:
  // The text embeddings of input_ids [B, S] with the images' features at the [IMG] tokens.
  at::Tensor input_embeddings(const Batch& batch, const at::Tensor& input_ids, ModelOutput& result) {
    const auto& c = c_;
    auto embeds = at::embedding(embed_tokens->weight.value, input_ids);  // [B, S, H]
    const auto image_mask = input_ids == c.image_token_index;
    const int64_t image_tokens = image_mask.sum().item<int64_t>();
    auto pixels = batch.find("pixel_values");
    if (pixels != batch.end() && pixels->second.size(0) > 0) {
      const auto& sizes = batch_get(batch, "image_sizes");
      at::Tensor features;
      if (pair_images_repeat(batch, pixels->second, sizes)) {
        // A preference micro-batch: its rejected rows carry its chosen rows' images, in the same
        // order (data/conversation/preference_collator.h). Each image is encoded once (the tower
        // sees every image apart from the others) and both halves take its features.
        const int64_t half = pixels->second.size(0) / 2;
        const auto once = image_features(pixels->second.narrow(0, 0, half), sizes.narrow(0, 0, half), result);
        features = at::cat({once, once});
      } else {
        features = image_features(pixels->second, sizes, result);
      }
      if (features.size(0) != image_tokens)
        fail("mistral3: ", image_tokens, " [IMG] tokens (id ", c.image_token_index, ") in input_ids but the images give ",
             features.size(0), " features: image tokens and image_sizes do not match");
      embeds = embeds.masked_scatter(image_mask.unsqueeze(-1), features.to(embeds.scalar_type()));
    } else if (image_tokens > 0) {
      fail("mistral3: input_ids hold ", image_tokens, " [IMG] tokens but the batch has no pixel_values");
    } else if (!vision->layers.empty()) {
      // No image here: run the tower on one blank image anyway, so every rank issues the same
      // collectives (the vision units' all-gathers, and their reduce-scatters when trained),
      // as LLaMA-Factory's dummy image does. It adds exactly zero to the embeddings.
      const int64_t side = c.patch_size * c.spatial_merge_size;
      ModelOutput discard;
      auto dummy = image_features(at::zeros({1, c.num_channels, side, side}, embeds.options()),
                                  at::tensor(std::vector<int64_t>{side, side}, at::kLong).view({1, 2}), discard);
      embeds = embeds + dummy.sum().to(embeds.scalar_type()) * 0.0;
    }
    return embeds;
  }

  // True when the batch is preference pairs whose second half of images repeats the first.
  static bool pair_images_repeat(const Batch& batch, const at::Tensor& pixels, const at::Tensor& sizes) {
    const int64_t n = pixels.size(0);
    if (!batch.count(kPreferencePairsKey) || n % 2 != 0 || sizes.size(0) != n) return false;
    return at::equal(pixels.narrow(0, 0, n / 2), pixels.narrow(0, n / 2, n / 2)) &&
           at::equal(sizes.narrow(0, 0, n / 2), sizes.narrow(0, n / 2, n / 2));
  }

  // Generation: the new rows x [T, H] through every layer with its cache, then the final norm and
  // lm_head of the last row: logits [V] fp32.
  at::Tensor run_cached(at::Tensor h, Cache& cache) {
    const int64_t T = h.size(0);
    const auto positions = at::arange(cache.length, cache.length + T,
                                      at::TensorOptions().dtype(at::kLong).device(h.device()));
    const auto [cos, sin] = rope_tables(positions, c_.head_dim, c_.rope_theta);
    for (size_t i = 0; i < layers.size(); ++i) {
      auto layer_ptr = layers[i];
      at::Tensor& keys = cache.keys[i];
      at::Tensor& values = cache.values[i];
      h = layers[i]->apply({h, cos, sin}, [layer_ptr, &keys, &values](const std::vector<at::Tensor>& in) {
        return layer_ptr->forward_cached(in[0], in[1], in[2], keys, values);
      });
    }
    cache.length += T;
    const auto last = rms_norm(h.narrow(0, T - 1, 1), norm->weight.value, c_.rms_norm_eps);
    return lin(last, lm_head).to(at::kFloat)[0];
  }

  // Vision tower + projector for all images of the batch: [sum_i L_i, H] in the text order.
  at::Tensor image_features(const at::Tensor& pixel_values, const at::Tensor& image_sizes, ModelOutput& result) {
    const auto& c = c_;
    const int64_t N = pixel_values.size(0), p = c.patch_size, m = c.spatial_merge_size;
    if (pixel_values.dim() != 4 || pixel_values.size(1) != c.num_channels)
      fail("batch 'pixel_values' must be [N_img, ", c.num_channels, ", H_max, W_max], got ", pixel_values.sizes());
    if (image_sizes.sizes() != at::IntArrayRef({N, 2}))
      fail("batch 'image_sizes' must be [N_img, 2] = [", N, ", 2], got ", image_sizes.sizes());
    const auto sizes = image_sizes.to(at::kCPU).to(at::kLong).contiguous();
    const int64_t* hw = sizes.data_ptr<int64_t>();
    const int64_t max_grid = c.image_size / p;
    std::vector<std::pair<int64_t, int64_t>> grids;  // patch grid (h_i, w_i) per image, before the merge
    std::vector<int64_t> patches;
    for (int64_t i = 0; i < N; ++i) {
      const int64_t H = hw[2 * i], W = hw[2 * i + 1];
      if (H < p || W < p || H > pixel_values.size(2) || W > pixel_values.size(3))
        fail("batch 'image_sizes'[", i, "] = (", H, ", ", W, ") must be >= patch_size ", p, " and <= the padded size (",
             pixel_values.size(2), ", ", pixel_values.size(3), ")");
      if (H / p > max_grid || W / p > max_grid)
        fail("batch 'image_sizes'[", i, "] = (", H, ", ", W, ") exceeds vision_config.image_size ", c.image_size);
      grids.emplace_back(H / p, W / p);
      patches.push_back((H / p) * (W / p));
    }

    std::optional<at::NoGradGuard> frozen;
    if (c.freeze_vision) frozen.emplace();  // no graph through the frozen tower and projector

    // patch_conv (stride = kernel, no bias) as a linear over (c, kh, kw)-flattened patches.
    const auto& conv = vision->patch_conv->weight.value;
    const auto pixels = pixel_values.to(conv.scalar_type());
    std::vector<at::Tensor> flat;
    for (int64_t i = 0; i < N; ++i) {
      const auto [h, w] = grids[i];
      auto img = pixels[i].narrow(1, 0, h * p).narrow(2, 0, w * p);  // [C, h p, w p]
      flat.push_back(img.reshape({c.num_channels, h, p, w, p}).permute({1, 3, 0, 2, 4}).reshape({h * w, -1}));
    }
    auto x = at::linear(at::cat(flat, 0), conv.reshape({c.vision_hidden_size, -1}));  // [P, Dv]
    x = rms_norm(x, vision->ln_pre->weight.value, kVisionEps);
    auto [cos, sin] = vision_rope(grids, c.vision_head_dim(), c.vision_rope_theta, pixel_values.device());
    for (auto& layer : vision->layers) {
      auto layer_ptr = layer;
      auto counts = patches;
      x = layer->apply({x, cos, sin}, [layer_ptr, counts](const std::vector<at::Tensor>& in) {
        return layer_ptr->forward(in[0], in[1], in[2], counts);
      });
    }
    result.tensors["vision_features"] = x;

    // Projector: RMSNorm, PatchMerger (unfold m x m: feature = ch*m*m + ki*m + kj; an odd last
    // row/column is dropped), linear_1, exact GELU, linear_2.
    auto normed = rms_norm(x, projector->norm->weight.value, c.rms_norm_eps);
    std::vector<at::Tensor> merged;
    int64_t begin = 0;
    for (int64_t i = 0; i < N; ++i) {
      const auto [h, w] = grids[i];
      auto grid = normed.narrow(0, begin, h * w).view({h, w, -1}).permute({2, 0, 1}).unsqueeze(0);  // [1, Dv, h, w]
      auto cols = at::im2col(grid, {m, m}, {1, 1}, {0, 0}, {m, m});                                  // [1, Dv m m, L]
      merged.push_back(cols.view({cols.size(1), -1}).t());
      begin += h * w;
    }
    auto features = lin(at::cat(merged, 0), projector->patch_merger->merging_layer);
    features = lin(at::gelu(lin(features, projector->linear_1)), projector->linear_2);
    result.tensors["projected_features"] = features;
    return features;
  }

  Mistral3Config c_;
  std::shared_ptr<VisionTower> vision;
  std::shared_ptr<Projector> projector;
  std::shared_ptr<Embedding> embed_tokens;
  std::shared_ptr<Norm> norm;
  std::shared_ptr<Linear> lm_head;
  std::vector<std::shared_ptr<TextLayer>> layers;
};

}  // namespace

std::shared_ptr<Model> make_mistral3(const Mistral3Config& config) { return std::make_shared<Mistral3Model>(config); }

}  // namespace mmtrain::mistral3
