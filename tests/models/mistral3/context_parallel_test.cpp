// Magistral under context parallelism (Ulysses 2 on 2 thread ranks): every CP rank runs the
// Pixtral tower whole, so vision attention issues no collective on the context-parallel groups.
// One forward + backward with two images of different sizes issues exactly the text layers'
// all-to-alls (q, k, v and the output, forward and backward) on the Ulysses group, and the loss's
// two sums (supervised count, loss) on the CP group.
#include "models/model_spec.h"
#include "multirank_harness.h"
#include "parallel/parallelize.h"
#include "train/train_step.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

namespace mmtrain {
namespace {

const nlohmann::json kConfig = nlohmann::json::parse(R"({
  "text_config": {"vocab_size": 48, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 40},
  "vision_config": {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 24,
                    "patch_size": 4, "image_size": 32, "hidden_act": "silu"},
  "image_token_index": 10, "spatial_merge_size": 2, "freeze_vision": true})");

TEST(Mistral3ContextParallel, VisionTowerIssuesNoContextParallelCollectives) {
  MeshShape shape;
  shape.ulysses = 2;
  testing::run_mesh_ranks(shape, [&](const DeviceMesh& mesh) {
    auto model = model_spec("mistral3").build(kConfig);
    ParallelizePlan plan;
    plan.fsdp.apply_modules = {"model.vision_tower.transformer.layers.{*}", "model.language_model.layers.{*}"};
    auto fsdp = parallelize(*model, plan, mesh);
    fsdp->init_params(5);
    // Two images: 16x16 (4x4 patches -> 4 [IMG]) and 8x16 (2x4 -> 2 [IMG]).
    auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
    auto ids = at::randint(14, 48, {1, 23}, gen, at::kLong);
    ids.narrow(1, 2, 4).fill_(10);
    ids.narrow(1, 9, 2).fill_(10);
    auto labels = ids.clone();
    labels.narrow(1, 0, 12).fill_(-100);
    auto pixels = at::randn({2, 3, 16, 16}, gen);
    const Batch batch = {{"input_ids", ids}, {"labels", labels}, {"pixel_values", pixels},
                         {"image_sizes", at::tensor(std::vector<int64_t>{16, 16, 8, 16}, at::kLong).view({2, 2})}};
    const int64_t ulysses_before = mesh.ulysses()->collectives_issued(), cp_before = mesh.cp()->collectives_issued();
    const auto out = forward_backward(*model, *fsdp, batch);
    EXPECT_TRUE(std::isfinite(out.loss.item<double>()));
    const int64_t text_layers = 2;
    EXPECT_EQ(mesh.ulysses()->collectives_issued() - ulysses_before, text_layers * 4 * 2) << "rank " << mesh.rank();
    EXPECT_EQ(mesh.cp()->collectives_issued() - cp_before, 2) << "rank " << mesh.rank();
  });
}

}  // namespace
}  // namespace mmtrain
