// The memory planner against the real engine: for the test transformer on 1, 2 and 4 thread
// ranks, the planned units, shard sizes and bytes equal what Fsdp and AdamW allocate. Plus the
// assignment rule on name tables, the in-flight window, and the MagiHuman figures.
#include "fsdp/fully_shard.h"
#include "fsdp/plan.h"

#include "core/error.h"
#include "models/activation_estimate.h"
#include "models/magihuman/memory.h"
#include "models/magihuman/model.h"
#include "models/model_spec.h"
#include "models/test_transformer/model.h"
#include "multirank_harness.h"
#include "nn/lora.h"
#include "optim/adamw.h"
#include "train/build.h"

#include <gtest/gtest.h>

#include <mutex>

namespace mmtrain {
namespace {

// Odd sizes so that most dim-0 splits are padded on 2 and 4 ranks.
const nlohmann::json kModelConfig = {{"vocab_size", 97}, {"hidden_size", 40}, {"num_layers", 3},
                                     {"num_heads", 4},   {"num_kv_heads", 2}, {"ffn_hidden_size", 70}};

// world, and the base: 0 trained, 1 LoRA adapters over a frozen bf16 base (fp32 adapters), 2 the same
// with the base in int8 rows (features.lora.base_quant; any shape splits into rows), 3 in nf4 (the
// [40, 40] attention weights wq and wo as stored rows of 8 weight rows, 320 elements; the others'
// row counts are no multiple of their group and they stay bf16).
class PlanVsFsdp : public ::testing::TestWithParam<std::tuple<int, int>> {};

std::shared_ptr<Model> planned_transformer(int lora) {
  auto model = make_test_transformer(kModelConfig);
  if (lora) {
    LoraConfig config;
    config.rank = 3;
    if (lora >= 2) config.base_quant = lora == 2 ? "int8" : "nf4";
    apply_lora(*model, config, {"layers.{*}.attn.w?", "layers.{*}.mlp.w2"}, {"layers.{*}.attn.w?", "layers.{*}.mlp.w?"});
  }
  return model;
}

TEST_P(PlanVsFsdp, ShardBytesEqualFsdpMemoryStats) {
  const auto [world, lora] = GetParam();
  FsdpConfig options;
  options.apply_modules = {"layers.{*}"};
  options.param_dtype = at::kBFloat16;
  options.num_to_forward_prefetch = 1;
  auto planned_model = planned_transformer(lora);
  const auto plan = fsdp_memory_plan(*planned_model, options, world);
  if (lora) EXPECT_LT(plan.trained_numel * 10, plan.total_numel);  // adapters only: the rest is frozen
  ASSERT_EQ(plan.units.size(), 4u);  // root + 3 layers

  std::mutex mutex;
  testing::run_ranks(world, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = planned_transformer(lora);
    Fsdp fsdp(*model, comm, options);
    auto adamw_ptr = make_fsdp_adamw(fsdp, AdamWOptions{});
    auto& adamw = *adamw_ptr;
    const auto stats = fsdp.memory_stats();
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(plan.param_bytes, stats.param_bytes) << "rank " << comm->rank();
    EXPECT_EQ(plan.grad_bytes, stats.grad_bytes);
    EXPECT_EQ(plan.unsharded_param_bytes, stats.unsharded_param_bytes);
    EXPECT_EQ(plan.optimizer_bytes, adamw.state_bytes());
    const auto units = fsdp.units();
    ASSERT_EQ(units.size(), plan.units.size());
    for (size_t u = 0; u < units.size(); ++u) {
      EXPECT_EQ(units[u]->name, plan.units[u].name);
      EXPECT_EQ(static_cast<int64_t>(units[u]->params.size()), plan.units[u].num_params);
      EXPECT_EQ(units[u]->shard_flat.numel(), plan.units[u].shard_numel) << units[u]->name;
      int64_t quantized = 0;
      for (auto& p : units[u]->params) quantized += p.quant != quant::BaseQuant::none ? p.layout.shard_numel() : 0;
      EXPECT_EQ(units[u]->frozen_flat.numel() + quantized, plan.units[u].frozen_shard_numel) << units[u]->name;
      int64_t gathered = 0;
      for (auto& p : units[u]->params) gathered += p.gathered.numel();
      EXPECT_EQ(gathered, plan.units[u].gathered_numel) << units[u]->name;
    }
  });
  // Padding only ever adds: 4 ranks hold at least a quarter each (fp32, or bf16 where frozen, about 1 byte in
  // int8, at least half a byte in nf4).
  const int64_t frozen = plan.total_numel - plan.trained_numel;
  EXPECT_GE(plan.param_bytes * world * 2, plan.trained_numel * 8 + frozen * (lora == 3 ? 1 : lora == 2 ? 2 : 4));
  if (lora >= 2) EXPECT_LT(plan.param_bytes * world, plan.trained_numel * 4 + frozen * 2);
  if (lora == 3) {
    int64_t quantized = 0;
    for (const auto& [name, param] : planned_model->named_parameters()) quantized += param->base_quant != quant::BaseQuant::none;
    EXPECT_EQ(quantized, 6);  // the three layers' wq and wo, in grouped rows
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, PlanVsFsdp, ::testing::Combine(::testing::Values(1, 2, 4), ::testing::Values(0, 1, 2, 3)),
                         [](const auto& info) {
                           const int lora = std::get<1>(info.param);
                           return "w" + std::to_string(std::get<0>(info.param)) +
                                  (lora == 1 ? "_lora" : lora == 2 ? "_qlora_int8" : lora == 3 ? "_qlora_nf4" : "");
                         });

TEST(FsdpPlan, DeepestUnitOwnsAParam) {
  const std::vector<PlanParam> params = {{"emb.w", {10, 4}}, {"blocks.0.attn.w", {8, 4}}, {"blocks.0.mlp.w", {8, 4}},
                                         {"blocks.1.attn.w", {8, 4}}, {"blocks.1.mlp.w", {8, 4}}, {"head.w", {3}}};
  const auto names = module_names_from_params(params);
  EXPECT_EQ(names, (std::vector<std::string>{"", "emb", "blocks", "blocks.0", "blocks.0.attn", "blocks.0.mlp",
                                             "blocks.1", "blocks.1.attn", "blocks.1.mlp", "head"}));
  std::vector<std::string> param_names;
  for (const auto& p : params) param_names.push_back(p.name);
  const auto a = fsdp_assign_units(names, param_names, {"blocks.{*}.mlp", "blocks.{*}"});
  // Units in module order, whatever the pattern order.
  EXPECT_EQ(a.units, (std::vector<std::string>{"", "blocks.0", "blocks.0.mlp", "blocks.1", "blocks.1.mlp"}));
  EXPECT_EQ(a.owner, (std::vector<size_t>{0, 1, 2, 3, 4, 0}));
  EXPECT_THROW(fsdp_assign_units(names, param_names, {"layers.{*}"}), Error);
}

TEST(FsdpPlan, InFlightWindowFollowsPrefetch) {
  // Units of 10, 50, 20, 30 rows x 1 (fp32, one rank): windows of 2 -> 50+20 = 70 from u1, each
  // unit gathered (W S; the shards are cast straight into it).
  const std::vector<PlanParam> params = {{"u.0.w", {10}}, {"u.1.w", {50}}, {"u.2.w", {20}}, {"u.3.w", {30}}};
  FsdpConfig options;
  options.apply_modules = {"u.{*}"};
  options.num_to_forward_prefetch = 1;
  options.num_to_backward_prefetch = 0;
  auto plan = fsdp_memory_plan(params, module_names_from_params(params), options, 1);
  EXPECT_EQ(plan.units_in_flight, 2);
  EXPECT_EQ(plan.in_flight_bytes, 70 * 4);
  EXPECT_EQ(plan.in_flight_first, "u.1");
  EXPECT_EQ(plan.root_gathered_bytes, 0);
  options.num_to_backward_prefetch = 2;  // the larger of the two prefetch depths counts
  plan = fsdp_memory_plan(params, module_names_from_params(params), options, 1);
  EXPECT_EQ(plan.in_flight_bytes, 100 * 4);
  options.reshard_after_forward = false;  // everything stays gathered
  plan = fsdp_memory_plan(params, module_names_from_params(params), options, 1);
  EXPECT_EQ(plan.in_flight_bytes, 110 * 4);
  // Backward: grads of the largest unit + the reductions of the 2 largest units (one in flight,
  // one being issued), each 2 W S: grads held or staged [W S], output [S], receive [(W-1) S], W = 1.
  EXPECT_EQ(plan.reduce_bytes, 50 * 4 + (2 * 50 + 2 * 30) * 4);
}

TEST(FsdpPlan, UnitsOfFp32LayersAreGatheredInFp32) {
  // A root of fp32 layers (MagiHuman's embedders and heads) and bf16 blocks.
  const std::vector<PlanParam> params = {{"embed.w", {10}, true}, {"u.0.w", {50}}, {"u.1.w", {20}}, {"head.w", {6}, true}};
  FsdpConfig options;
  options.apply_modules = {"u.{*}"};
  options.param_dtype = at::kBFloat16;
  const auto plan = fsdp_memory_plan(params, module_names_from_params(params), options, 1);
  EXPECT_EQ(plan.units[0].gather_dtype, at::kFloat);
  EXPECT_EQ(plan.units[1].gather_dtype, at::kBFloat16);
  EXPECT_EQ(plan.root_gathered_bytes, 16 * 4);
  EXPECT_EQ(plan.unsharded_param_bytes, 16 * 4 + 70 * 2);
  // One fp32 layer among bf16 ones in a unit cannot be gathered by one all-gather.
  const std::vector<PlanParam> mixed = {{"embed.w", {10}, true}, {"u.0.w", {50}}, {"norm.w", {4}}};
  EXPECT_THROW(fsdp_memory_plan(mixed, module_names_from_params(mixed), options, 1), Error);
  options.param_dtype = at::kFloat;  // nothing to mix under fp32
  EXPECT_EQ(fsdp_memory_plan(mixed, module_names_from_params(mixed), options, 1).units[0].gather_dtype, at::kFloat);
}

TEST(FsdpPlan, BlocksOnly) {
  auto model = make_test_transformer(kModelConfig);
  FsdpConfig attention_unit;
  attention_unit.apply_modules = {"layers.0.attn"};
  EXPECT_THROW(fsdp_memory_plan(*model, attention_unit, 1), Error);  // not a block: Fsdp refuses it too
}

TEST(FsdpPlan, MagiHumanFullModelOnEightRanks) {
  const magihuman::MagiHumanConfig full;
  const auto model = magihuman::make_magihuman(full);  // shapes only: nothing is allocated
  int64_t trainable = 0;
  for (auto& [name, param] : model->named_parameters()) trainable += param->trainable;
  EXPECT_EQ(trainable, 330);  // 331 checkpoint tensors less the rope bands buffer
  FsdpConfig options;
  options.apply_modules = {"dit.block.layers.{*}"};
  options.param_dtype = at::kBFloat16;
  options.num_to_forward_prefetch = 2;
  options.num_to_backward_prefetch = 2;
  const auto plan = fsdp_memory_plan(*model, options, 8);
  EXPECT_EQ(plan.units.size(), 41u);
  EXPECT_EQ(plan.total_numel, 15299419152 - 16);
  EXPECT_EQ(plan.param_bytes, (15299419152 - 16) / 2);  // every dim 0 divides by 8: no padding
  EXPECT_EQ(plan.optimizer_bytes, 2 * plan.param_bytes);
  EXPECT_EQ(plan.units_in_flight, 3);
  EXPECT_EQ(plan.in_flight_first, "dit.block.layers.0");  // the GELU7 expert layers are the largest
}

TEST(FsdpPlan, MagiHumanActivations) {
  const magihuman::MagiHumanConfig full;
  const auto a = magihuman::magihuman_activation_estimate(full, 4606);
  // Per token: 257,872 B in a SwiGLU7 layer, 244,232 B in a GELU7 one (memory.h).
  EXPECT_EQ(a.max_layer_full_bytes, 257872LL * 4606);
  EXPECT_EQ(a.layers_full_bytes, (36 * 257872LL + 4 * 244232LL) * 4606);
  EXPECT_EQ(a.layer_inputs_bytes, 40LL * 4 * 5120 * 4606);
  EXPECT_EQ(a.with_recompute_bytes(),
            a.layer_inputs_bytes + a.max_layer_full_bytes + a.outside_bytes + a.backward_bytes);
  EXPECT_LT(a.with_recompute_bytes(), a.without_recompute_bytes() / 5);
  // Linear in tokens (block-diagonal flash-style attention keeps no L x L matrix).
  const auto half = magihuman::magihuman_activation_estimate(full, 2303);
  EXPECT_EQ(2 * half.layers_full_bytes, a.layers_full_bytes);
}

// Mistral3's text model as a dense decoder: each layer's saved tensors by hand at Magistral-Small's
// widths, and the chunked loss keeping one chunk's logits instead of the whole sequence's.
TEST(FsdpPlan, Mistral3Activations) {
  const auto& spec = model_spec("mistral3");
  ASSERT_TRUE(spec.activations);
  const nlohmann::json text = {{"hidden_size", 5120},    {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                               {"head_dim", 128},       {"intermediate_size", 32768}, {"num_hidden_layers", 40},
                               {"vocab_size", 131072}};
  const nlohmann::json whole = {{"text_config", text}, {"vision_config", nlohmann::json::object()}};
  nlohmann::json chunked = whole;
  chunked["loss_chunk_size"] = 1024;
  const auto a = spec.activations(ActivationQuery{whole, 4096, 1, at::kBFloat16});
  // T = 4096, H = 5120, 32 q / 8 kv heads of 128, F = 32768, bf16: norms 2 x (3 T H 2 + 4 T),
  // attention T (64 + 16) 128 x 2 + 4 T 32, o_proj T 4096 x 2, SwiGLU 4 T F 2.
  const int64_t t = 4096;
  EXPECT_EQ(a.max_layer_full_bytes, 2 * (3 * t * 5120 * 2 + 4 * t) + t * 80 * 128 * 2 + 4 * t * 32 + t * 4096 * 2 +
                                        4 * t * 32768 * 2);
  EXPECT_EQ(a.layers_full_bytes, 40 * a.max_layer_full_bytes);
  EXPECT_EQ(a.layer_inputs_bytes, 40 * t * 5120 * 2);
  EXPECT_EQ(a.q_width, 4096);
  EXPECT_EQ(a.kv_width, 1024);
  const auto c = spec.activations(ActivationQuery{chunked, 4096, 1, at::kBFloat16});
  // The logits (bf16) and the loss's fp32 copy and log-softmax: 131072 x (2 + 8) B per token.
  EXPECT_EQ(a.outside_bytes - c.outside_bytes, (4096 - 1024) * 131072LL * 10);
}

// A trained Pixtral tower (freeze_vision: false) at Magistral-Small's vision widths: two images of
// a sample, 1024 x 768 and 512 x 512 pixels, patch 14 -> (73 x 54) + (36 x 36) = 5238 patches; the
// tower's layers are kept whole (dense-layer rule over the patches, no head) plus the projector;
// a frozen tower, or a sample without images, adds nothing.
TEST(FsdpPlan, Mistral3TrainedVisionTowerActivations) {
  const auto& spec = model_spec("mistral3");
  const nlohmann::json text = {{"hidden_size", 5120},    {"num_attention_heads", 32}, {"num_key_value_heads", 8},
                               {"head_dim", 128},       {"intermediate_size", 32768}, {"num_hidden_layers", 40},
                               {"vocab_size", 131072}};
  const nlohmann::json vision = {{"hidden_size", 1024}, {"num_hidden_layers", 24}, {"num_attention_heads", 16},
                                 {"intermediate_size", 4096}, {"patch_size", 14}, {"image_size", 1540}};
  nlohmann::json trained = {{"text_config", text}, {"vision_config", vision}, {"freeze_vision", false}};
  nlohmann::json frozen = trained;
  frozen["freeze_vision"] = true;
  const std::vector<std::pair<int64_t, int64_t>> images = {{1024, 768}, {512, 512}};
  const auto text_only = spec.activations(ActivationQuery{trained, 4096, 2, at::kBFloat16});
  const auto with_tower = spec.activations(ActivationQuery{trained, 4096, 2, at::kBFloat16, images});
  const auto with_frozen = spec.activations(ActivationQuery{frozen, 4096, 2, at::kBFloat16, images});
  EXPECT_EQ(with_frozen.outside_bytes, text_only.outside_bytes);
  EXPECT_EQ(with_frozen.backward_bytes, text_only.backward_bytes);
  // P = 2 samples x 5238 patches; vh = 1024, 16 heads of 64, F = 4096, bf16 (e = 2), merge 2.
  const int64_t p = 2 * (73 * 54 + 36 * 36), vh = 1024, e = 2;
  const int64_t layer = 2 * (3 * p * vh * e + 4 * p) + p * 64 * 64 * e + 4 * p * 16 + p * 1024 * e + 4 * p * 4096 * e;
  const int64_t tower_outside = 3 * p * vh * e + 8 * (p + 2);
  const int64_t projector = 4 * p * vh * e + (p / 4) * (vh + 2 * 5120) * e;
  EXPECT_EQ(with_tower.outside_bytes - text_only.outside_bytes, 24 * layer + tower_outside + projector);
  EXPECT_EQ(with_tower.layers_full_bytes, text_only.layers_full_bytes);  // the text layers' rule is unchanged
  EXPECT_EQ(with_tower.backward_bytes, text_only.backward_bytes);        // the text MLP's grads are wider
}

}  // namespace
}  // namespace mmtrain
