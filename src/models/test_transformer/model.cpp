#include "models/test_transformer/model.h"

#include "core/error.h"
#include "core/param_map.h"
#include "models/config_check.h"
#include "nn/layers.h"
#include "nn/ops.h"

namespace mmtrain {
namespace {

// The test transformer's checkpoint is fp32 throughout.
std::shared_ptr<Linear> linear_layer(int64_t out, int64_t in) { return std::make_shared<Linear>(out, in, at::kFloat); }
std::shared_ptr<Norm> norm_layer(int64_t width) { return std::make_shared<Norm>(width, at::kFloat, NormInit::one); }

class Attention : public Module {
 public:
  explicit Attention(const TestTransformerConfig& c)
      : head_dim_(c.hidden_size / c.num_heads), heads_(c.num_heads), kv_heads_(c.num_kv_heads) {
    wq = add_child("wq", linear_layer(heads_ * head_dim_, c.hidden_size));
    wk = add_child("wk", linear_layer(kv_heads_ * head_dim_, c.hidden_size));
    wv = add_child("wv", linear_layer(kv_heads_ * head_dim_, c.hidden_size));
    wo = add_child("wo", linear_layer(c.hidden_size, heads_ * head_dim_));
  }
  // x [B,S,H], cos/sin [S,hd] -> [B,S,H]
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    const int64_t b = x.size(0), s = x.size(1);
    auto q = apply_rope(wq->forward(x).view({b, s, heads_, head_dim_}), cos, sin);
    auto k = apply_rope(wk->forward(x).view({b, s, kv_heads_, head_dim_}), cos, sin);
    auto v = wv->forward(x).view({b, s, kv_heads_, head_dim_});
    auto out = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                {}, 0.0, /*is_causal=*/true, std::nullopt, /*enable_gqa=*/true);
    return wo->forward(out.transpose(1, 2).reshape({b, s, heads_ * head_dim_}));
  }
  std::shared_ptr<Linear> wq, wk, wv, wo;

 private:
  int64_t head_dim_, heads_, kv_heads_;
};

class Mlp : public Module {
 public:
  explicit Mlp(const TestTransformerConfig& c) {
    w1 = add_child("w1", linear_layer(c.ffn_hidden_size, c.hidden_size));
    w3 = add_child("w3", linear_layer(c.ffn_hidden_size, c.hidden_size));
    w2 = add_child("w2", linear_layer(c.hidden_size, c.ffn_hidden_size));
  }
  at::Tensor forward(const at::Tensor& x) {
    if (w1->has_lora() || w3->has_lora() || w2->has_lora())  // the same ops, each with its adapter
      return w2->forward(silu_mul(w1->forward(x), w3->forward(x)));
    return swiglu_mlp(x, w1->weight.value, w3->weight.value, w2->weight.value);
  }
  std::shared_ptr<Linear> w1, w3, w2;
};

class Layer : public Module {
 public:
  explicit Layer(const TestTransformerConfig& c) : eps_(c.rms_norm_eps) {
    attn_norm = add_child("attn_norm", norm_layer(c.hidden_size));
    attn = add_child("attn", std::make_shared<Attention>(c));
    mlp_norm = add_child("mlp_norm", norm_layer(c.hidden_size));
    mlp = add_child("mlp", std::make_shared<Mlp>(c));
    mark_block();
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    auto h = x + attn->forward(rms_norm(x, attn_norm->weight.value, eps_), cos, sin);
    return h + mlp->forward(rms_norm(h, mlp_norm->weight.value, eps_));
  }
  std::shared_ptr<Norm> attn_norm, mlp_norm;
  std::shared_ptr<Attention> attn;
  std::shared_ptr<Mlp> mlp;

 private:
  double eps_;
};

class LayerList : public Module {
 public:
  LayerList(const TestTransformerConfig& c) {
    for (int64_t i = 0; i < c.num_layers; ++i)
      layers.push_back(add_child(std::to_string(i), std::make_shared<Layer>(c)));
  }
  std::vector<std::shared_ptr<Layer>> layers;
};

class TestTransformer : public Model {
 public:
  explicit TestTransformer(const TestTransformerConfig& c) : config_(c) {
    embed = add_child("embed", std::make_shared<Embedding>(c.vocab_size, c.hidden_size, at::kFloat));
    layers = add_child("layers", std::make_shared<LayerList>(c));
    norm = add_child("norm", norm_layer(c.hidden_size));
    lm_head = add_child("lm_head", linear_layer(c.vocab_size, c.hidden_size));
  }

  // batch["tokens"] [B, S+1] int64: predicts tokens[:, 1:] from tokens[:, :-1].
  ModelOutput forward(const Batch& batch) override {
    const auto& tokens = batch_get(batch, "tokens");
    auto inputs = tokens.narrow(1, 0, tokens.size(1) - 1);
    auto labels = tokens.narrow(1, 1, tokens.size(1) - 1);
    const int64_t s = inputs.size(1);
    auto [cos, sin] = rope_tables(at::arange(s, tokens.options().dtype(at::kFloat)), config_.hidden_size / config_.num_heads,
                                  config_.rope_theta);
    auto x = at::embedding(embed->weight.value, inputs);
    for (auto& layer : layers->layers) {
      x = layer->apply({x, cos, sin}, [layer](const std::vector<at::Tensor>& in) {
        return layer->forward(in[0], in[1], in[2]);
      });
    }
    auto logits = lm_head->forward(rms_norm(x, norm->weight.value, config_.rms_norm_eps));
    ModelOutput out;
    auto flat_logits = logits.to(at::kFloat).reshape({-1, config_.vocab_size});
    const auto normalizer = loss_normalizer(batch, 0);  // a token-budget step's global token count
    out.loss = normalizer ? at::cross_entropy_loss(flat_logits, labels.reshape({-1}), {}, at::Reduction::Sum) / *normalizer
                          : at::cross_entropy_loss(flat_logits, labels.reshape({-1}));
    out.tokens = inputs.numel();
    return out;
  }

  // Every predicted token is supervised.
  std::vector<double> loss_counts(const Batch& batch) const override {
    const auto& tokens = batch_get(batch, "tokens");
    return {static_cast<double>(tokens.size(0) * (tokens.size(1) - 1))};
  }

  double train_flops(const Batch& batch) const override {
    const auto& tokens = batch_get(batch, "tokens");
    const auto f = test_transformer_flops(config_, static_cast<double>(tokens.size(1) - 1));
    return static_cast<double>(tokens.size(0)) * (f.matmul + f.attention);
  }

  std::shared_ptr<Embedding> embed;
  std::shared_ptr<LayerList> layers;
  std::shared_ptr<Norm> norm;
  std::shared_ptr<Linear> lm_head;

 private:
  TestTransformerConfig config_;
};

}  // namespace

TestTransformerConfig TestTransformerConfig::from_json(const nlohmann::json& j) {
  TestTransformerConfig c;
  const ParamMap m(j, "model.config", "test_transformer");
  m.check_known_keys({"vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "ffn_hidden_size",
                      "rope_theta", "rms_norm_eps"});
  c.vocab_size = m.get_int("vocab_size", c.vocab_size);
  c.hidden_size = m.get_int("hidden_size", c.hidden_size);
  c.num_layers = m.get_int("num_layers", c.num_layers);
  c.num_heads = m.get_int("num_heads", c.num_heads);
  c.num_kv_heads = m.get_int("num_kv_heads", c.num_kv_heads);
  c.ffn_hidden_size = m.get_int("ffn_hidden_size", c.ffn_hidden_size);
  c.rope_theta = m.get_double("rope_theta", c.rope_theta);
  c.rms_norm_eps = m.get_double("rms_norm_eps", c.rms_norm_eps);
  for (const auto& [key, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size}, {"hidden_size", c.hidden_size},
                                   {"num_layers", c.num_layers}, {"num_heads", c.num_heads},
                                   {"num_kv_heads", c.num_kv_heads}, {"ffn_hidden_size", c.ffn_hidden_size}})
    require_at_least(key, value);
  if (c.hidden_size % c.num_heads != 0)
    fail("model.config: hidden_size ", c.hidden_size, " is not divisible by num_heads ", c.num_heads);
  if (c.num_heads % c.num_kv_heads != 0)
    fail("model.config: num_heads ", c.num_heads, " is not divisible by num_kv_heads ", c.num_kv_heads);
  if ((c.hidden_size / c.num_heads) % 2 != 0) fail("model.config: head_dim must be even for RoPE");
  return c;
}

TestTransformerFlops test_transformer_flops(const TestTransformerConfig& c, double s) {
  const double hd = static_cast<double>(c.hidden_size) / c.num_heads;
  const double per_layer = c.hidden_size * hd * (2.0 * c.num_heads + 2.0 * c.num_kv_heads) +
                           3.0 * c.hidden_size * c.ffn_hidden_size;
  const double matmul_params = c.num_layers * per_layer + static_cast<double>(c.vocab_size) * c.hidden_size;
  return {6.0 * matmul_params * s, 6.0 * 2.0 * c.num_layers * (s * s / 2.0) * c.num_heads * hd};
}

std::shared_ptr<Model> make_test_transformer(const nlohmann::json& model_config) {
  return std::make_shared<TestTransformer>(TestTransformerConfig::from_json(model_config));
}

}  // namespace mmtrain
