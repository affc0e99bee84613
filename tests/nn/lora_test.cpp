// LoRA (nn/lora.h) without FSDP, fp32: the adapted model's loss equals the base model's with the
// merged weights W_k + scale * B_k A_k (per modality expert k for MagiHuman), and the adapters'
// grads equal the chain rule through the merged weight (dA_k = scale B_k^T dW_k, dB_k = scale
// dW_k A_k^T); apply_lora freezes what it should and refuses bad targets by name.
#include "core/error.h"
#include "models/magihuman/model.h"
#include "models/test_transformer/model.h"
#include "nn/layers.h"
#include "nn/lora.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace mmtrain {
namespace {

const nlohmann::json kTransformer = {{"vocab_size", 64}, {"hidden_size", 32}, {"num_layers", 2},
                                     {"num_heads", 4},   {"num_kv_heads", 2}, {"ffn_hidden_size", 48}};
const std::vector<std::string> kTransformerTargets = {"layers.{*}.attn.w?", "layers.{*}.mlp.w?", "lm_head"};

nlohmann::json tiny_magihuman() {
  return {{"num_layers", 4},         {"hidden_size", 64},       {"head_dim", 16},    {"num_query_groups", 2},
          {"video_in_channels", 16}, {"audio_in_channels", 8}, {"text_in_channels", 24}, {"mm_layers", {0, 3}},
          {"gelu7_layers", {0}}};
}
const std::vector<std::string> kMagiTargets = {"dit.block.layers.{*}.attention.linear_qkv", "dit.block.layers.{*}.attention.linear_proj",
                                               "dit.block.layers.{*}.mlp.up_gate_proj", "dit.block.layers.{*}.mlp.down_proj"};

// Every param gets a full fp32 value (the init rule; LoRA's B random too, so the adapters act);
// trained ones require grad.
void fill(Module& model, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& [name, p] : model.named_parameters()) {
    if (!p->trainable) {
      p->value = p->init_value();
      continue;
    }
    p->value = param_init_rows(*p, name, seed, 0, p->shape[0]).clone();
    if (name.find("lora_B") != std::string::npos || name.find("norm") != std::string::npos)
      p->value = at::randn(p->shape, gen) * 0.05;
    if (p->requires_grad) p->value.requires_grad_(true);
  }
}

struct Merged {
  std::shared_ptr<Model> model;
  std::map<std::string, std::pair<Linear*, Linear*>> layers;  // name -> (adapted, merged)
};

// The adapted model's Linears, and a base model whose weights are the adapted ones merged.
Merged merge(Module& adapted, std::shared_ptr<Model> base) {
  Merged out{std::move(base), {}};
  std::map<std::string, Module*> base_modules;
  for (auto& [name, m] : out.model->named_modules()) base_modules[name] = m;
  std::map<std::string, Param*> base_params;
  for (auto& [name, p] : out.model->named_parameters()) base_params[name] = p;
  for (auto& [name, p] : adapted.named_parameters())
    if (base_params.count(name)) base_params[name]->value = p->value.detach().clone();
  for (auto& [name, m] : adapted.named_modules()) {
    auto* linear = dynamic_cast<Linear*>(m);
    if (!linear || !linear->has_lora()) continue;
    auto* target = dynamic_cast<Linear*>(base_modules.at(name));
    const int64_t e = linear->experts();
    auto a = linear->lora_A->weight.value.detach(), b = linear->lora_B->weight.value.detach();
    std::vector<at::Tensor> rows;
    for (int64_t k = 0; k < e; ++k) rows.push_back(at::mm(b.chunk(e, 0)[k], a.chunk(e, 0)[k]) * linear->lora_scale);
    target->weight.value = (target->weight.value + at::cat(rows, 0)).requires_grad_(true);
    out.layers[name] = {linear, target};
  }
  return out;
}

// The adapted model's loss and adapter grads against the merged model's loss and chain-rule grads.
void expect_adapted_equals_merged(const std::shared_ptr<Model>& adapted, const std::shared_ptr<Model>& base,
                                  const Batch& batch) {
  auto merged = merge(*adapted, base);
  const auto loss = adapted->forward(batch).loss;
  const auto reference = merged.model->forward(batch).loss;
  EXPECT_NEAR(loss.item<double>(), reference.item<double>(), 1e-5 * std::abs(reference.item<double>()));
  loss.backward();
  reference.backward();
  ASSERT_FALSE(merged.layers.empty());
  for (auto& [name, pair] : merged.layers) {
    auto [linear, target] = pair;
    const int64_t e = linear->experts();
    const double s = linear->lora_scale;
    auto dw = target->weight.value.grad();
    auto a = linear->lora_A->weight.value.detach(), b = linear->lora_B->weight.value.detach();
    std::vector<at::Tensor> da, db;
    for (int64_t k = 0; k < e; ++k) {
      auto dw_k = dw.chunk(e, 0)[k];
      da.push_back(at::mm(b.chunk(e, 0)[k].t(), dw_k) * s);
      db.push_back(at::mm(dw_k, a.chunk(e, 0)[k].t()) * s);
    }
    for (const auto& [got, want, what] :
         {std::tuple{linear->lora_A->weight.value.grad(), at::cat(da, 0), "lora_A"},
          std::tuple{linear->lora_B->weight.value.grad(), at::cat(db, 0), "lora_B"}}) {
      ASSERT_TRUE(got.defined()) << name << " " << what << " got no grad";
      const double scale = want.abs().max().item<double>();
      EXPECT_LE((got - want).abs().max().item<double>(), 1e-5 * scale + 1e-9) << name << " " << what;
    }
    EXPECT_FALSE(linear->weight.value.requires_grad()) << name << ": the base must be frozen";
  }
}

LoraConfig lora(int64_t rank, double alpha, std::vector<std::string> targets) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = alpha;
  c.target_modules = std::move(targets);
  return c;
}

TEST(Lora, TestTransformerEqualsItsMergedWeightsWithChainRuleGrads) {
  auto adapted = make_test_transformer(kTransformer);
  const auto summary = apply_lora(*adapted, lora(4, 8.0, {}), {"layers.{*}.attn.w?", "layers.{*}.mlp.w?"}, kTransformerTargets);
  EXPECT_EQ(summary.adapted.size(), 14u);  // 2 layers x (4 attention + 3 MLP)
  fill(*adapted, 11);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(2);
  const Batch batch{{"tokens", at::randint(0, 64, {3, 9}, gen, at::kLong)}};
  expect_adapted_equals_merged(adapted, make_test_transformer(kTransformer), batch);
}

Batch magihuman_batch(const nlohmann::json& config) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(4);
  const int64_t L = 37;  // two packed samples of odd lengths, every modality present
  auto model_config = magihuman::MagiHumanConfig::from_json(config);
  auto modality = at::randint(0, 3, {L}, gen, at::kLong);
  auto coords = at::full({L, 9}, 4.0);  // positions in a 4 x 4 x 4 grid, whose size is also the reference size
  coords.narrow(1, 0, 3).copy_(at::randint(0, 4, {L, 3}, gen, at::kLong));
  return Batch{{"x", at::randn({L, model_config.io_width()}, gen)},
               {"coords_mapping", coords},
               {"modality_mapping", modality},
               {"cu_seqlens", at::tensor(std::vector<int64_t>{0, 16, L}).to(at::kInt)},
               {"target_velocity", at::randn({L, model_config.out_width()}, gen)},
               {"loss_mask", at::ones({L}, at::kFloat)}};
}

TEST(Lora, MagiHumanExpertsEachGetTheirAdapterAndEqualTheMergedWeights) {
  auto adapted = magihuman::make_magihuman(magihuman::MagiHumanConfig::from_json(tiny_magihuman()));
  LoraConfig config = lora(4, 4.0, kMagiTargets);
  config.use_rslora = true;  // alpha / sqrt(r) = 2
  const auto summary = apply_lora(*adapted, config, {}, kMagiTargets);
  EXPECT_EQ(summary.adapted.size(), 16u);
  for (auto& [name, m] : adapted->named_modules())
    if (auto* linear = dynamic_cast<Linear*>(m); linear && linear->has_lora()) {
      EXPECT_DOUBLE_EQ(linear->lora_scale, 2.0);
      const bool expert_layer = name.find("layers.0.") != std::string::npos || name.find("layers.3.") != std::string::npos;
      EXPECT_EQ(linear->experts(), expert_layer ? 3 : 1) << name;  // mm_layers: one pair per modality
      EXPECT_EQ(linear->lora_A->weight.shape[0], 4 * linear->experts()) << name;
    }
  fill(*adapted, 12);
  expect_adapted_equals_merged(adapted, magihuman::make_magihuman(magihuman::MagiHumanConfig::from_json(tiny_magihuman())),
                               magihuman_batch(tiny_magihuman()));
}

TEST(Lora, FreezesTheBaseAndTrainsModulesToSave) {
  auto model = make_test_transformer(kTransformer);
  LoraConfig config = lora(2, 4.0, {"layers.0.attn.wq"});
  config.modules_to_save = {"lm_head"};
  const auto summary = apply_lora(*model, config, {}, kTransformerTargets);
  for (auto& [name, p] : model->named_parameters()) {
    const bool trains = name.find("lora_") != std::string::npos || name == "lm_head.weight";
    EXPECT_EQ(p->requires_grad, trains) << name;
    EXPECT_EQ(p->adapter_dtype.has_value(), name.find("lora_") != std::string::npos) << name;
  }
  EXPECT_EQ(summary.adapter_params, 2 * 32 + 32 * 2);
  EXPECT_EQ(summary.trainable_params, summary.adapter_params + 64 * 32);
  EXPECT_DOUBLE_EQ(config.scale(), 2.0);
}

void expect_refused(LoraConfig config, const std::string& needle, const std::vector<std::string>& supported = kTransformerTargets) {
  auto model = make_test_transformer(kTransformer);
  try {
    apply_lora(*model, config, {}, supported);
    ADD_FAILURE() << "accepted; expected an error naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Lora, BadTargetsAreNamedErrors) {
  expect_refused(lora(4, 8, {"layers.{*}.attn.wx"}), "pattern 'layers.{*}.attn.wx' matches no module");
  expect_refused(lora(4, 8, {"layers.{*}.attn_norm"}), "is not a Linear layer");
  expect_refused(lora(4, 8, {"layers.0.attn"}), "is not a Linear layer");
  expect_refused(lora(33, 8, {"layers.0.attn.wq"}), "33 is above min(in, out) = 32");
  LoraConfig both = lora(4, 8, {"lm_head"});
  both.modules_to_save = {"lm_head"};
  expect_refused(both, "is both a target");
  expect_refused(lora(4, 8, {"lm_head"}), "computed from its raw weight", {"layers.{*}.attn.w?"});
  expect_refused(lora(4, 8, {}), "names no default targets");
}

}  // namespace
}  // namespace mmtrain
