// MagiHuman DiT forward and loss, exactly as the upstream training forward (daVinci-MagiHuman's
// DiT and its flow-matching loss; docs/magihuman.md). Tokens stay in their original packed order throughout; modality experts gather their
// rows by index (the upstream permutation to modality-sorted order is a speed trick with the
// same math). Precision follows upstream: fp32 residual stream, norms, RoPE and activations;
// block GEMMs in the parameter dtype (bf16 in real runs) with outputs rounded to it before the
// upcast; attention inputs in the parameter dtype.
#include "models/magihuman/model.h"

#include "core/error.h"
#include "models/magihuman/flops.h"
#include "models/magihuman/ops.h"
#include "nn/fused_ops.h"
#include "nn/layers.h"
#include "nn/sequence_split.h"

#include <array>

namespace mmtrain::magihuman {
namespace {

// The public checkpoint stores linear weights and biases in bf16, norms in fp32; norms are the
// zero-centred (1 + w) form.
std::shared_ptr<Linear> linear_layer(int64_t out, int64_t in, bool with_bias = false, int64_t experts = 1) {
  return std::make_shared<Linear>(out, in, at::kBFloat16, with_bias, experts);
}
std::shared_ptr<Norm> norm_layer(int64_t width) { return std::make_shared<Norm>(width, at::kFloat, NormInit::zero); }

// Row indices of each modality in the packed sequence, computed once per forward.
struct ModalityRows {
  std::array<at::Tensor, kNumModalities> index;  // int64 [N_k]
  std::array<int64_t, kNumModalities> count{};
  // int64 [L]: where packed row r sits among the modality-sorted rows (the present modalities'
  // index[k] one after another), so that one gather puts per-modality results back in order.
  at::Tensor packed_from_sorted;
};

ModalityRows modality_rows(const at::Tensor& modality) {
  ModalityRows rows;
  std::vector<at::Tensor> present;
  for (int k = 0; k < kNumModalities; ++k) {
    rows.index[k] = (modality == k).nonzero().view(-1);
    rows.count[k] = rows.index[k].numel();
    if (rows.count[k] > 0) present.push_back(rows.index[k]);
  }
  const int64_t L = modality.size(0);
  const auto sorted = at::cat(present);
  if (sorted.numel() != L)
    fail("batch 'modality_mapping': ", L - sorted.numel(), " of ", L, " rows hold a value outside [0, ",
         kNumModalities, ")");
  rows.packed_from_sorted = at::empty({L}, sorted.options()).scatter_(0, sorted, at::arange(L, sorted.options()));
  return rows;
}

// fn(k, rows of modality k) for each present modality k, the results back in packed order: one
// concatenation and one gather (scattering each part into a zeroed output would copy the whole
// output once per modality, forward and backward). One expert (E = 1): one call on all rows.
template <typename Fn>
at::Tensor per_modality(const at::Tensor& x, const ModalityRows& rows, Fn fn) {
  std::vector<at::Tensor> parts;
  for (int k = 0; k < kNumModalities; ++k)
    if (rows.count[k] > 0) parts.push_back(fn(k, x.index_select(0, rows.index[k])));
  return at::cat(parts).index_select(0, rows.packed_from_sorted);
}
template <typename Fn>
at::Tensor per_expert(const at::Tensor& x, const ModalityRows& rows, int64_t experts, Fn fn) {
  return experts == 1 ? fn(0, x) : per_modality(x, rows, fn);
}

// Expert k's rows of a modality-expert weight: contiguous dim-0 chunks, video/audio/text.
at::Tensor expert_slice(const at::Tensor& w, int64_t experts, int64_t k) {
  return experts == 1 ? w : w.chunk(experts, 0)[k];
}

// x @ W^T in W's dtype, result rounded to W's dtype then upcast to fp32.
at::Tensor block_linear(const at::Tensor& x, const at::Tensor& w) {
  return at::linear(x.to(w.scalar_type()), w).to(at::kFloat);
}

// model.config.fused_ops picks the fused CPU kernels (nn/fused_ops.h) or the reference ATen ops
// (ops.h, the oracle); tensors off the CPU always take the reference ops.
at::Tensor norm_1p(const MagiHumanConfig& c, const at::Tensor& x, const at::Tensor& w) {
  return c.fused_ops && x.is_cpu() ? fused_rms_norm_1p(x, w, c.norm_eps) : rms_norm_1p(x, w, c.norm_eps);
}
at::Tensor partial_rope(const MagiHumanConfig& c, const at::Tensor& x, const at::Tensor& rope) {
  return c.fused_ops && x.is_cpu() ? fused_partial_rope(x, rope) : apply_partial_rope(x, rope);
}
// u [L, up_gate_rows] fp32 -> [L, mlp_width] fp32
at::Tensor mlp_activation(const MagiHumanConfig& c, const at::Tensor& u, bool gelu7_layer) {
  const bool interleaved = !c.deinterleave_mlp;
  if (c.fused_ops && u.is_cpu()) return gelu7_layer ? fused_gelu7(u) : fused_swiglu7(u, interleaved);
  return gelu7_layer ? gelu7(u) : swiglu7(u, interleaved);
}

class Attention : public Module {
 public:
  Attention(const MagiHumanConfig& c, int64_t experts) : c_(c), experts_(experts) {
    pre_norm = add_child("pre_norm", norm_layer(c.hidden_size * experts));
    linear_qkv = add_child("linear_qkv", linear_layer(c.qkv_width() * experts, c.hidden_size, false, experts));
    linear_proj = add_child("linear_proj", linear_layer(c.hidden_size * experts, c.hidden_size, false, experts));
    q_norm = add_child("q_norm", norm_layer(c.head_dim * experts));
    k_norm = add_child("k_norm", norm_layer(c.head_dim * experts));
  }

  // h [L, D] fp32 -> [L, D] in the parameter dtype
  at::Tensor forward(const at::Tensor& h, const at::Tensor& rope, const ModalityRows& rows, const SequenceSplit& seq) {
    const auto& c = c_;
    const int64_t L = h.size(0), hq = c.num_heads_q(), hkv = c.num_query_groups, hd = c.head_dim;
    auto qkv = per_expert(h, rows, experts_, [&](int64_t k, const at::Tensor& part) {
      auto a = norm_1p(c, part, expert_slice(pre_norm->weight.value, experts_, k));
      return linear_qkv->with_lora(block_linear(a, expert_slice(linear_qkv->weight.value, experts_, k)), a, k);
    });                                                                               // [L, qkv] fp32
    // One split, not four slices: a slice's backward writes its grad into a zeroed [L, qkv]
    // tensor of its own (four of them summed); the split's backward concatenates the pieces once.
    const int64_t gate_width = qkv.size(1) - (hq + 2 * hkv) * hd;  // hq with attention gating, else 0
    const auto pieces = at::split_with_sizes(qkv, {hq * hd, hkv * hd, hkv * hd, gate_width}, 1);
    auto q = pieces[0].view({L, hq, hd});
    auto key = pieces[1].view({L, hkv, hd});
    auto v = pieces[2].view({L, hkv, hd});
    q = per_expert(q, rows, experts_, [&](int64_t k, const at::Tensor& part) {
      return norm_1p(c, part, expert_slice(q_norm->weight.value, experts_, k));
    });
    key = per_expert(key, rows, experts_, [&](int64_t k, const at::Tensor& part) {
      return norm_1p(c, part, expert_slice(k_norm->weight.value, experts_, k));
    });
    q = partial_rope(c, q, rope);
    key = partial_rope(c, key, rope);

    // Full attention within each packed sample, none across samples, over the CP ranks when the
    // sequence is split.
    const auto compute = linear_qkv->weight.value.scalar_type();
    auto o = seq.attention(q.to(compute), key.to(compute), v.to(compute), /*causal=*/false);  // [L, Hq, hd]
    at::Tensor gated = o.to(at::kFloat);
    if (c.enable_attn_gating) {
      auto g = pieces[3].view({L, hq, 1});
      gated = o * at::sigmoid(g);  // per (token, head) gate; compute dtype x fp32 -> fp32
    }
    gated = gated.reshape({L, hq * hd}).to(compute);
    return per_expert(gated, rows, experts_, [&](int64_t k, const at::Tensor& part) {
      return linear_proj->with_lora(at::linear(part, expert_slice(linear_proj->weight.value, experts_, k)), part, k);
    });
  }

  std::shared_ptr<Norm> pre_norm, q_norm, k_norm;
  std::shared_ptr<Linear> linear_qkv, linear_proj;

 private:
  MagiHumanConfig c_;
  int64_t experts_;
};

class Mlp : public Module {
 public:
  Mlp(const MagiHumanConfig& c, int64_t layer, int64_t experts) : c_(c), experts_(experts), gelu7_(c.is_gelu7_layer(layer)) {
    pre_norm = add_child("pre_norm", norm_layer(c.hidden_size * experts));
    up_gate_proj = add_child("up_gate_proj",
                             linear_layer(c.up_gate_rows(layer) * experts, c.hidden_size, false, experts));
    down_proj = add_child("down_proj",
                          linear_layer(c.hidden_size * experts, c.mlp_width(layer), false, experts));
  }

  // h [L, D] fp32 -> [L, D] fp32
  at::Tensor forward(const at::Tensor& h, const ModalityRows& rows) {
    return per_expert(h, rows, experts_, [&](int64_t k, const at::Tensor& part) {
      auto b = norm_1p(c_, part, expert_slice(pre_norm->weight.value, experts_, k));
      auto u = up_gate_proj->with_lora(block_linear(b, expert_slice(up_gate_proj->weight.value, experts_, k)), b, k);
      auto z = mlp_activation(c_, u, gelu7_);
      return down_proj->with_lora(block_linear(z, expert_slice(down_proj->weight.value, experts_, k)), z, k);
    });
  }

  std::shared_ptr<Norm> pre_norm;
  std::shared_ptr<Linear> up_gate_proj, down_proj;

 private:
  MagiHumanConfig c_;
  int64_t experts_;
  bool gelu7_;
};

class Layer : public Module {
 public:
  Layer(const MagiHumanConfig& c, int64_t layer) {
    attention = add_child("attention", std::make_shared<Attention>(c, c.experts(layer)));
    mlp = add_child("mlp", std::make_shared<Mlp>(c, layer, c.experts(layer)));
    mark_block();
  }
  at::Tensor forward(const at::Tensor& h, const at::Tensor& rope, const ModalityRows& rows, const SequenceSplit& seq) {
    auto x = h + attention->forward(h, rope, rows, seq);
    return x + mlp->forward(x, rows);
  }
  std::shared_ptr<Attention> attention;
  std::shared_ptr<Mlp> mlp;
};

class Adapter : public Module {
 public:
  explicit Adapter(const MagiHumanConfig& c) {
    const int64_t d = c.hidden_size;
    video_embedder = add_child("video_embedder", linear_layer(d, c.video_in_channels, /*with_bias=*/true));
    text_embedder = add_child("text_embedder", linear_layer(d, c.text_in_channels, /*with_bias=*/true));
    audio_embedder = add_child("audio_embedder", linear_layer(d, c.audio_in_channels, /*with_bias=*/true));
    rope = add_child("rope", std::make_shared<ModuleGroup>());
    bands = &rope->add_param("bands", {c.rope_bands()});
    bands->trainable = false;
    bands->checkpoint_dtype = at::kFloat;
    const int64_t count = c.rope_bands();
    bands->init_value = [count] {
      // bands[k] = 1 / 10000^(k / B), computed as upstream: fp32 exponent, then the power.
      auto exponent = at::arange(0, count, 1, at::kLong).to(at::kFloat) / static_cast<double>(count);
      return 1.0 / at::pow(10000.0, exponent);
    };
  }
  std::shared_ptr<Linear> video_embedder, text_embedder, audio_embedder;
  std::shared_ptr<ModuleGroup> rope;
  Param* bands = nullptr;
};

class MagiHumanModel : public Model, public SplitsSequence {
 public:
  explicit MagiHumanModel(const MagiHumanConfig& config) : c_(config) {
    const auto& c = c_;
    auto dit = add_child("dit", std::make_shared<ModuleGroup>());
    adapter = dit->add_child("adapter", std::make_shared<Adapter>(c));
    auto block = dit->add_child("block", std::make_shared<ModuleGroup>());
    auto layer_list = block->add_child("layers", std::make_shared<ModuleGroup>());
    for (int64_t i = 0; i < c.num_layers; ++i)
      layers.push_back(layer_list->add_child(std::to_string(i), std::make_shared<Layer>(c, i)));
    final_norm_video = dit->add_child("final_norm_video", norm_layer(c.hidden_size));
    final_norm_audio = dit->add_child("final_norm_audio", norm_layer(c.hidden_size));
    final_linear_video = dit->add_child("final_linear_video",
                                        linear_layer(c.video_in_channels, c.hidden_size));
    final_linear_audio = dit->add_child("final_linear_audio",
                                        linear_layer(c.audio_in_channels, c.hidden_size));
    // As upstream, only the blocks compute in param_dtype: the adapter's embedders and the final
    // norms and heads are fp32 layers (they form the root FSDP unit, gathered in fp32).
    for (auto& [name, param] : named_parameters())
      if (name.rfind("dit.block.", 0) != 0) param->compute_in_fp32 = true;
    std::vector<NamedShape> tensors;
    for (auto& [name, param] : named_parameters()) tensors.emplace_back(name, param->shape);
    active_linear_params_ = magihuman_active_linear_params(tensors, c.mm_layers);
  }

  // What a Ulysses split of the heads must divide.
  std::vector<AttentionHeads> attention_heads() const override {
    return {{c_.num_heads_q(), c_.num_query_groups, "model.config (hidden_size / head_dim)",
             "model.config.num_query_groups"}};
  }

  ModelOutput forward(const Batch& batch) override {
    const auto& c = c_;
    const auto& full_x = batch_get(batch, "x");
    const auto& cu_seqlens = batch_get(batch, "cu_seqlens");
    const int64_t total = full_x.size(0);
    if (full_x.dim() != 2 || full_x.size(1) != c.io_width())
      fail("batch 'x' must be [L, ", c.io_width(), "], got ", full_x.sizes());
    if (batch_get(batch, "coords_mapping").sizes() != at::IntArrayRef({total, 9}))
      fail("batch 'coords_mapping' must be [", total, ", 9], got ", batch_get(batch, "coords_mapping").sizes());
    if (batch_get(batch, "modality_mapping").sizes() != at::IntArrayRef({total}))
      fail("batch 'modality_mapping' must be [", total, "], got ", batch_get(batch, "modality_mapping").sizes());
    // This rank's rows of the packed stream: all of them, or its share under context
    // parallelism (padding rows are text rows outside every sample and the loss).
    const auto stream = cu_seqlens_from(cu_seqlens, total, "batch 'cu_seqlens'");
    const auto seq = split_sequence(stream, /*causal=*/false);
    const auto x = seq->take(full_x);
    const auto coords = seq->take(batch_get(batch, "coords_mapping"));
    const auto modality = seq->take(batch_get(batch, "modality_mapping"), kText);
    const auto target = seq->take(batch_get(batch, "target_velocity"));
    const auto loss_mask = seq->take(batch_get(batch, "loss_mask"), 0);
    const int64_t L = x.size(0);

    const ModalityRows rows = modality_rows(modality);

    // Adapter: per-modality embedders over the right column slices, fp32 output.
    const int64_t in_width[kNumModalities] = {c.video_in_channels, c.audio_in_channels, c.text_in_channels};
    const std::shared_ptr<Linear> embedder[kNumModalities] = {adapter->video_embedder, adapter->audio_embedder,
                                                              adapter->text_embedder};
    at::Tensor h = per_modality(x, rows, [&](int64_t k, const at::Tensor& part) {
      const auto& w = embedder[k]->weight.value;
      return at::linear(part.slice(1, 0, in_width[k]).to(w.scalar_type()), w, embedder[k]->bias->value)
          .to(at::kFloat);
    });
    auto rope = fourier_rope(coords, adapter->bands->value);

    for (auto& layer : layers) {
      // The lambda may run again in backward (recompute): capture by value only.
      auto layer_ptr = layer;
      auto rows_copy = rows;
      h = layer->apply({h, rope}, [layer_ptr, rows_copy, seq](const std::vector<at::Tensor>& in) {
        return layer_ptr->forward(in[0], in[1], rows_copy, *seq);
      });
    }

    // Final per-modality norms and heads; [L, out] with zeros where a modality has no channel.
    at::Tensor prediction = at::zeros({L, c.out_width()}, h.options());
    const std::pair<int, std::pair<std::shared_ptr<Norm>, std::shared_ptr<Linear>>> heads[] = {
        {kVideo, {final_norm_video, final_linear_video}}, {kAudio, {final_norm_audio, final_linear_audio}}};
    for (const auto& [k, head] : heads) {
      if (rows.count[k] == 0) continue;
      auto part = norm_1p(c, h.index_select(0, rows.index[k]), head.first->weight.value);
      const auto& w = head.second->weight.value;
      auto out = at::linear(part.to(w.scalar_type()), w).to(at::kFloat);
      out = at::constant_pad_nd(out, {0, c.out_width() - out.size(1)});
      prediction = prediction.index_copy(0, rows.index[k], out);
    }

    ModelOutput result;
    result.tokens = L;
    result.tensors["prediction"] = prediction;
    if (batch.count(kSampleTermLossesKey)) {
      result.sample_term_losses = sample_term_losses(prediction, target, modality, loss_mask, *seq, batch, stream);
      // As for the loss below: every CP rank runs the whole backward.
      if (seq->is_split()) result.sample_term_losses = result.sample_term_losses + h.sum() * 0.0;
      return result;
    }
    result.loss = seq->is_split()
                      ? split_flow_matching_loss(prediction, target, modality, loss_mask, *seq, batch, &result.term_losses)
                      : flow_matching_loss(prediction, target, modality, loss_mask, batch, &result.term_losses);
    // Under context parallelism every rank must run the whole backward (its attention sends
    // gradients to the other ranks), even when none of its rows reaches the loss.
    if (seq->is_split()) result.loss = result.loss + h.sum() * 0.0;
    return result;
  }

  // Each packed sample's flow-matching loss per term (models/model.h's kSampleTermLossesKey):
  // [N, 2], sample n's mean of (pred - target)^2 over its supervised video (audio) elements.
  // Local rows are this rank's (seq); their sums are added over the CP ranks, the counts come
  // from the whole batch. stream: the whole batch's cu_seqlens, N + 1 entries.
  at::Tensor sample_term_losses(const at::Tensor& prediction, const at::Tensor& target, const at::Tensor& modality,
                                const at::Tensor& loss_mask, const SequenceSplit& seq, const Batch& batch,
                                const std::vector<int64_t>& stream) const {
    const int64_t samples = static_cast<int64_t>(stream.size()) - 1;
    const auto full_owner = sequence_of_rows(stream, prediction.device());
    const auto local_owner = seq.take(full_owner, 0);  // padding rows are outside loss_mask
    const auto full_supervised = batch_get(batch, "loss_mask").to(at::kBool);
    const auto& full_modality = batch_get(batch, "modality_mapping");
    const auto diff = (prediction - target.to(at::kFloat)).pow(2);
    std::vector<at::Tensor> terms;
    for (const int k : kLossTerms) {
      const auto full_rows = ((full_modality == k) & full_supervised).nonzero().view(-1);
      const auto counts = at::zeros({samples}, at::kFloat)
                              .to(prediction.device())
                              .index_add(0, full_owner.index_select(0, full_rows),
                                         at::ones({full_rows.numel()}, prediction.options()))
                              * static_cast<double>(loss_channels(k));
      const auto rows = ((modality == k) & loss_mask.to(at::kBool)).nonzero().view(-1);
      const auto row_sums = diff.index_select(0, rows).slice(1, 0, loss_channels(k)).sum(1);
      const auto sums = seq.sum(at::zeros({samples}, diff.options()).index_add(0, local_owner.index_select(0, rows), row_sums));
      terms.push_back(sums / counts.clamp_min(1.0));
    }
    return at::stack(terms, 1);
  }

  // The loss terms, in the order of loss_counts and the batch's loss_normalizer: video, audio.
  static constexpr int kLossTerms[] = {kVideo, kAudio};
  int64_t loss_channels(int modality) const {
    return modality == kVideo ? c_.video_in_channels : c_.audio_in_channels;
  }

  // mean over video rows x video channels + mean over audio rows x audio channels of
  // (pred - target)^2, rows where loss_mask; a term is skipped when its modality is absent. With
  // the batch's loss_normalizer (a token-budget step), each term's sum over the global count.
  // terms: each term's part of the loss, in kLossTerms order (0 for an absent modality).
  at::Tensor flow_matching_loss(const at::Tensor& prediction, const at::Tensor& target, const at::Tensor& modality,
                                const at::Tensor& loss_mask, const Batch& batch, std::vector<at::Tensor>* terms) const {
    auto diff = (prediction - target.to(at::kFloat)).pow(2);
    at::Tensor loss;
    for (size_t t = 0; t < std::size(kLossTerms); ++t) {
      const int k = kLossTerms[t];
      auto index = ((modality == k) & loss_mask.to(at::kBool)).nonzero().view(-1);
      if (index.numel() == 0) {
        terms->push_back(at::zeros({}, at::kFloat));
        continue;
      }
      auto elements = diff.index_select(0, index).slice(1, 0, loss_channels(k));
      const auto normalizer = loss_normalizer(batch, t);
      auto term = normalizer ? elements.sum() / *normalizer : elements.mean();
      terms->push_back(term.detach());
      loss = loss.defined() ? loss + term : term;
    }
    return loss.defined() ? loss : diff.sum() * 0.0;
  }

  // The same loss over a split sequence: each term's sum and count over all CP ranks, so that
  // every rank holds the unsplit value (its grads are those of its own rows).
  at::Tensor split_flow_matching_loss(const at::Tensor& prediction, const at::Tensor& target,
                                      const at::Tensor& modality, const at::Tensor& loss_mask,
                                      const SequenceSplit& seq, const Batch& batch,
                                      std::vector<at::Tensor>* terms) const {
    auto diff = (prediction - target.to(at::kFloat)).pow(2);
    at::Tensor loss = diff.sum() * 0.0;
    for (size_t t = 0; t < std::size(kLossTerms); ++t) {
      const int k = kLossTerms[t];
      auto index = ((modality == k) & loss_mask.to(at::kBool)).nonzero().view(-1);
      const int64_t rows = seq.sum(index.numel());  // the same on every CP rank
      if (rows == 0) {
        terms->push_back(at::zeros({}, at::kFloat));
        continue;
      }
      auto local = diff.index_select(0, index).slice(1, 0, loss_channels(k)).sum();
      const double normalizer = loss_normalizer(batch, t).value_or(static_cast<double>(rows * loss_channels(k)));
      auto term = seq.sum(local / normalizer);
      terms->push_back(term.detach());
      loss = loss + term;
    }
    return loss;
  }

  // Supervised elements per term: rows of the modality where loss_mask, times its channels (what
  // the loss's means divide by), over the whole batch (every CP rank's rows).
  std::vector<std::string> loss_term_names() const override { return {"video", "audio"}; }

  std::vector<double> loss_counts(const Batch& batch) const override {
    const auto& modality = batch_get(batch, "modality_mapping");
    const auto supervised = batch_get(batch, "loss_mask").to(at::kBool);
    std::vector<double> counts;
    for (const int k : kLossTerms)
      counts.push_back(static_cast<double>(((modality == k) & supervised).sum().item<int64_t>() * loss_channels(k)));
    return counts;
  }

  // The seed's convention (docs/flops.md): 6 x active linear params x tokens + 7 s^2 attention.
  // Under context parallelism each CP rank does 1/cp of its sample's work.
  double train_flops(const Batch& batch) const override {
    const double flops = magihuman_train_flops_for_batch(c_, batch_get(batch, "cu_seqlens"), active_linear_params_);
    return rank_share(flops);
  }

 private:
  MagiHumanConfig c_;
  double active_linear_params_ = 0;  // N of the seed's FLOPs rule, over this model's own tensors
  std::shared_ptr<Adapter> adapter;
  std::vector<std::shared_ptr<Layer>> layers;
  std::shared_ptr<Norm> final_norm_video, final_norm_audio;
  std::shared_ptr<Linear> final_linear_video, final_linear_audio;
};

}  // namespace

std::shared_ptr<Model> make_magihuman(const MagiHumanConfig& config) {
  return std::make_shared<MagiHumanModel>(config);
}

}  // namespace mmtrain::magihuman
