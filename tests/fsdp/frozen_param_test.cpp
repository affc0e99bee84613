// Frozen parameters (Param::requires_grad = false) under FSDP on 2 thread ranks, with and without
// recompute: they are kept in the dtype they are gathered in, outside the optimizer's shards, get
// no grad and stay bitwise unchanged; the trained params' grads equal plain autograd on the
// whole model (no FSDP) over both ranks' samples. The frozen set covers every kind of unit: a
// mixed unit whose input needs no grad (layers.0), a frozen-only unit whose input does
// (layers.1), a mixed unit whose frozen norm is needed after its last trained grad (layers.2),
// and a mixed root.
#include "fsdp/fully_shard.h"
#include "models/test_transformer/model.h"
#include "multirank_harness.h"
#include "optim/adamw.h"
#include "parallel/recompute.h"

#include <gtest/gtest.h>

#include <mutex>

namespace mmtrain {
namespace {

const nlohmann::json kConfig = {{"vocab_size", 64}, {"hidden_size", 32}, {"num_layers", 3},
                                {"num_heads", 4},   {"num_kv_heads", 2}, {"ffn_hidden_size", 48}};
constexpr uint64_t kSeed = 3;

bool is_frozen(const std::string& name) {
  return name == "embed.weight" || name == "layers.0.attn_norm.weight" || name.rfind("layers.1.", 0) == 0 ||
         name == "layers.2.attn_norm.weight" || name == "layers.2.attn.wq.weight";
}

std::shared_ptr<Model> frozen_model() {
  auto model = make_test_transformer(kConfig);
  for (auto& [name, p] : model->named_parameters())
    if (is_frozen(name)) p->requires_grad = false;
  return model;
}

at::Tensor samples() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  return at::randint(0, 64, {8, 9}, gen, at::kLong);
}

// Plain autograd on the whole model: the mean of the two ranks' losses, the trained params' grads.
std::map<std::string, at::Tensor> reference_grads() {
  auto model = frozen_model();
  std::map<std::string, at::Tensor> grads;
  for (auto& [name, p] : model->named_parameters()) {
    p->value = param_init_rows(*p, name, kSeed, 0, p->shape[0]).clone();
    if (p->requires_grad) p->value.requires_grad_(true);
  }
  const auto all = samples();
  auto loss = (model->forward(Batch{{"tokens", all.narrow(0, 0, 4)}}).loss +
               model->forward(Batch{{"tokens", all.narrow(0, 4, 4)}}).loss) / 2;
  loss.backward();
  for (auto& [name, p] : model->named_parameters())
    if (p->requires_grad) grads[name] = p->value.grad();
  return grads;
}

class FsdpFrozen : public ::testing::TestWithParam<bool> {};

TEST_P(FsdpFrozen, FrozenParamsStayInTheirDtypeWithNoGradAndTheRestEqualsAutograd) {
  const bool recompute = GetParam();
  const auto want = reference_grads();
  const auto all = samples();
  std::mutex mutex;
  testing::run_ranks(2, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = frozen_model();
    if (recompute) apply_recompute(*model, {"layers.{*}"});
    FsdpConfig options;
    options.apply_modules = {"layers.{*}"};
    Fsdp fsdp(*model, comm, options);
    fsdp.init_params(kSeed);
    const int rank = comm->rank();
    auto units = fsdp.units();
    std::vector<at::Tensor> params, grads, frozen_before;
    for (auto* unit : units) {
      int64_t trained = 0, frozen = 0;
      for (auto& p : unit->params) (p.frozen ? frozen : trained) += p.layout.shard_numel();
      EXPECT_EQ(unit->shard_flat.numel(), trained) << unit->name;  // the optimizer sees trained params only
      EXPECT_EQ(unit->frozen_flat.numel(), frozen) << unit->name;
      params.push_back(unit->shard_flat);
      grads.push_back(unit->grad_flat);
      frozen_before.push_back(unit->frozen_flat.clone());
    }
    AdamW adamw(params, grads, {0.9, 0.95, 1e-8, 0.1});
    for (int step = 0; step < 3; ++step) {
      fsdp.zero_grad();
      fsdp.begin_forward();
      model->forward(Batch{{"tokens", all.narrow(0, rank * 4, 4)}}).loss.backward();
      fsdp.finish_backward();
      if (step == 0) {
        std::lock_guard<std::mutex> lock(mutex);
        for (auto* unit : units)
          for (auto& p : unit->params) {
            if (p.frozen) {
              EXPECT_FALSE(p.param->value.defined() && p.param->value.requires_grad()) << p.name;
              continue;
            }
            const int64_t rows = p.layout.rows(rank);
            if (rows == 0) continue;
            auto got = p.view_of(unit->grad_flat).narrow(0, 0, rows);
            auto expected = want.at(p.name).narrow(0, p.layout.row_begin(rank), rows);
            EXPECT_TRUE(at::allclose(got, expected, 1e-5, 1e-6))
                << p.name << " rank " << rank << ": max difference " << (got - expected).abs().max().item<float>() << " got norm " << got.norm().item<float>() << " want " << expected.norm().item<float>();
          }
      }
      adamw.step(1e-2);
    }
    for (size_t u = 0; u < units.size(); ++u)
      EXPECT_TRUE(at::equal(units[u]->frozen_flat, frozen_before[u])) << units[u]->name << " frozen params changed";
    EXPECT_GT(adamw.moments(0).exp_avg.abs().max().item<float>(), 0.0f);  // the root's trained params moved
  });
}

INSTANTIATE_TEST_SUITE_P(Recompute, FsdpFrozen, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "recompute" : "no_recompute"; });

// In bf16 compute the frozen shards are bf16 (2 bytes a parameter, not fp32 master + grad +
// moments), and a unit of frozen params only has no optimizer state at all.
TEST(FsdpFrozenDtype, FrozenShardsAreKeptInTheGatherDtype) {
  testing::run_ranks(2, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = frozen_model();
    FsdpConfig options;
    options.apply_modules = {"layers.{*}"};
    options.param_dtype = at::kBFloat16;
    Fsdp fsdp(*model, comm, options);
    for (auto* unit : fsdp.units()) {
      EXPECT_EQ(unit->frozen_flat.scalar_type(), at::kBFloat16) << unit->name;
      EXPECT_EQ(unit->shard_flat.scalar_type(), at::kFloat) << unit->name;
      if (unit->name == "layers.1") EXPECT_EQ(unit->shard_flat.numel(), 0);
    }
  });
}

}  // namespace
}  // namespace mmtrain
