// mistral3 under FSDP on 2 thread ranks (vision and text layers as units, frozen vision tower and
// projector) equals 1 rank: every rank trains on the same batch, so the averaged grads equal the
// single-rank ones (the 2-rank run also recomputes every block). Frozen params stay bitwise unchanged, the trainable ones move.
#include "fsdp/fully_shard.h"
#include "models/mistral3/flops.h"
#include "models/model_spec.h"
#include "multirank_harness.h"
#include "optim/adamw.h"
#include "parallel/parallelize.h"
#include "train/build.h"
#include "train/train_step.h"

#include <gtest/gtest.h>

#include <mutex>

namespace mmtrain {
namespace {

const nlohmann::json kConfig = nlohmann::json::parse(R"({
  "text_config": {"vocab_size": 48, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 12, "intermediate_size": 40, "rope_theta": 1000.0},
  "vision_config": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 24,
                    "patch_size": 4, "image_size": 32, "hidden_act": "silu"},
  "image_token_index": 10, "spatial_merge_size": 2, "freeze_vision": true})");

Batch make_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto ids = at::randint(14, 48, {1, 16}, gen, at::kLong);
  ids.narrow(1, 2, 4).fill_(10);  // one 16x16 image: 4x4 patches -> 2x2 = 4 [IMG]
  auto labels = ids.clone();
  labels.narrow(1, 0, 7).fill_(-100);
  auto pixels = at::zeros({1, 3, 20, 16});  // padded below
  pixels.narrow(2, 0, 16).normal_(0.0, 1.0, gen);
  return {{"input_ids", ids}, {"labels", labels}, {"pixel_values", pixels},
          {"image_sizes", at::tensor(std::vector<int64_t>{16, 16}, at::kLong).view({1, 2})}};
}

struct Result {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Batch text_only_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  auto ids = at::randint(14, 48, {1, 16}, gen, at::kLong);
  auto labels = ids.clone();
  labels.narrow(1, 0, 3).fill_(-100);
  return {{"input_ids", ids}, {"labels", labels}};
}

// mixed: rank r of 2 trains on batch r (with / without an image); on 1 rank, the two batches
// are accumulated with loss / 2 each, which is the same global step.
Result train(int world, bool recompute = false, bool mixed = false) {
  Result result;
  std::mutex mutex;
  const auto batch = make_batch();
  const std::vector<Batch> mixed_batches = {make_batch(), text_only_batch()};
  testing::run_ranks(world, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = model_spec("mistral3").build(kConfig);
    ParallelizePlan plan;
    plan.fsdp.apply_modules = {"model.vision_tower.transformer.layers.{*}", "model.language_model.layers.{*}"};
    if (recompute) plan.recompute_modules = plan.fsdp.apply_modules;  // frozen vision blocks: no-op
    auto fsdp_ptr = parallelize(*model, plan, comm);
    auto& fsdp = *fsdp_ptr;
    fsdp.init_params(5);
    auto adamw_ptr = make_fsdp_adamw(fsdp, AdamWOptions{0.9, 0.95, 1e-8, 0.1});
    StateFiniteness finiteness;
    auto& adamw = *adamw_ptr;
    std::vector<double> losses;
    for (int step = 0; step < 3; ++step) {
      const int accumulation = mixed ? 2 / world : 1;
      const StepSettings settings{step + 1, accumulation, 1e-2, 1.0};
      const auto stats = train_step(*model, fsdp, adamw, finiteness, settings, [&](int m) {
        return mixed ? mixed_batches[world == 1 ? m : comm->rank()] : batch;
      });
      losses.push_back(mixed ? comm->all_reduce_sum(stats.loss_sum) / 2 : stats.loss_sum);
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (comm->rank() == 0) result.losses = losses;
    testing::add_shard_rows(fsdp, comm->rank(), result.params);
  });
  return result;
}

void expect_equal_runs(const Result& one, const Result& two);

TEST(Mistral3Fsdp, TwoRanksWithRecomputeEqualOneRankWithFrozenVision) {
  expect_equal_runs(train(1), train(2, /*recompute=*/true));
}

// One rank has an image, the other none: the blank-image path keeps the collectives matched.
TEST(Mistral3Fsdp, RanksWithAndWithoutImagesEqualOneRankAccumulating) {
  expect_equal_runs(train(1, false, /*mixed=*/true), train(2, false, /*mixed=*/true));
}

void expect_equal_runs(const Result& one, const Result& two) {
  ASSERT_EQ(one.losses.size(), two.losses.size());
  for (size_t i = 0; i < one.losses.size(); ++i) EXPECT_NEAR(one.losses[i], two.losses[i], 1e-5 * std::abs(one.losses[i]));
  EXPECT_LT(one.losses.back(), one.losses.front());

  // Fresh params (the same init) to tell frozen from trained.
  auto model = model_spec("mistral3").build(kConfig);
  Fsdp fresh(*model, std::make_shared<Comm>(nullptr, 0, 1), FsdpConfig{});
  fresh.init_params(5);
  int frozen = 0, trained = 0;
  for (auto* unit : fresh.units())
    for (auto& p : unit->params) {
      const auto& a = one.params.at(p.name);
      const auto& b = two.params.at(p.name);
      EXPECT_LE((a - b).norm().item<double>(), 1e-5 * a.norm().item<double>() + 1e-12) << p.name;
      const auto init = p.shard.narrow(0, 0, p.layout.dim0);
      if (!p.param->requires_grad) {
        ++frozen;
        EXPECT_TRUE(at::equal(a, init)) << p.name << " changed although frozen (1 rank)";
        EXPECT_TRUE(at::equal(b, init)) << p.name << " changed although frozen (2 ranks)";
      } else {
        ++trained;
        EXPECT_FALSE(at::equal(a, init)) << p.name << " did not train";
      }
    }
  EXPECT_EQ(frozen, 2 + 2 * 9 + 4);  // patch_conv, ln_pre, 2 vision layers x 9, projector 4
  EXPECT_EQ(trained, 1 + 2 * 9 + 1 + 1);  // embed, 2 text layers x 9, norm, lm_head
}

}  // namespace
}  // namespace mmtrain

namespace mmtrain {
namespace {

// The worked figures of Magistral-Small-2509 (24B).
const char* kMagistral = R"({
    "text_config": {"vocab_size": 131072, "hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 32,
                    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 32768, "rope_theta": 1e9},
    "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                      "intermediate_size": 4096, "patch_size": 14, "image_size": 1540, "hidden_act": "silu"},
    "image_token_index": 10, "spatial_merge_size": 2})";

// Shapes only (nothing allocated): Magistral-Small-2509's parameter counts.
TEST(Mistral3Shapes, SpecParameterCounts) {
  auto model = model_spec("mistral3").build(nlohmann::json::parse(kMagistral));
  const auto adapter = make_hf_adapter(model_spec("mistral3"), nlohmann::json::parse(kMagistral));
  int64_t total = 0, vision = 0, projector = 0, tensors = 0;
  for (auto& [name, p] : model->named_parameters()) {
    int64_t n = 1;
    for (int64_t d : p->shape) n *= d;
    total += n;
    ++tensors;
    if (name.rfind("model.vision_tower.", 0) == 0) vision += n;
    if (name.rfind("model.multi_modal_projector.", 0) == 0) projector += n;
    EXPECT_EQ(adapter->hf_key(name), name);
  }
  EXPECT_EQ(total, 24011361280);
  EXPECT_EQ(vision, 403305472);
  EXPECT_EQ(projector, 35652608);
  EXPECT_EQ(tensors, 40 * 9 + 3 + 24 * 9 + 2 + 4);
  EXPECT_EQ(adapter->hf_key_aliases("lm_head.weight"), std::vector<std::string>{"language_model.lm_head.weight"});
  EXPECT_EQ(adapter->hf_key_aliases("model.language_model.norm.weight"),
            std::vector<std::string>{"language_model.model.norm.weight"});
  EXPECT_EQ(adapter->hf_key_aliases("model.vision_tower.ln_pre.weight"), std::vector<std::string>{"vision_tower.ln_pre.weight"});
}

TEST(Mistral3Flops, SpecFigures) {
  const auto c = mistral3::Mistral3Config::from_json(nlohmann::json::parse(kMagistral));
  // S = 2048 unpacked: 137.41 GFLOP (6 N_mm, N_mm = 22,900,899,840) + 1,966,080 * 1024.5 per token.
  const double per_token = mistral3::mistral3_train_flops(c, {2048}, {}) / 2048;
  EXPECT_NEAR(per_token, 6.0 * 22900899840.0 + 1966080.0 * 1024.5, 1.0);
  EXPECT_NEAR(per_token / 1e9, 139.4, 0.05);
  // One 504x644 image, vision and projector frozen: 1656 patches -> 1.61 TFLOP, 414 merged -> 29.5 GFLOP.
  const double image = mistral3::mistral3_train_flops(c, {1}, {{504, 644}}) - mistral3::mistral3_train_flops(c, {1}, {});
  const double vision = 1656 * (2.0 * (24 * 16777216.0 + 602112.0) + 98304.0 * 1656);
  const double projector = 414 * 2.0 * 35651584.0;  // projector matmuls: 4,194,304 + 5,242,880 + 26,214,400
  EXPECT_NEAR(image, vision + projector, 1.0);
  EXPECT_NEAR(vision / 1e12, 1.61, 0.01);
  EXPECT_NEAR(projector / 1e9, 29.5, 0.05);
}

}  // namespace
}  // namespace mmtrain
