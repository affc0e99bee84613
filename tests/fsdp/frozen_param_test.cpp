// Frozen parameters (Param::requires_grad = false) under FSDP on 2 thread ranks: their grad
// shards stay zero even when autograd produces grads for them, and AdamW with the units'
// trainable masks (weight decay on) leaves them bitwise unchanged while the rest trains.
#include "fsdp/fully_shard.h"
#include "models/test_transformer/model.h"
#include "multirank_harness.h"
#include "optim/adamw.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

bool is_frozen(const std::string& name) { return name.rfind("layers.0.", 0) == 0 || name == "embed.weight"; }

TEST(FsdpFrozen, FrozenParamsGetNoGradAndNoUpdate) {
  const nlohmann::json config = {{"vocab_size", 64}, {"hidden_size", 32}, {"num_layers", 2},
                                 {"num_heads", 4},   {"num_kv_heads", 2}, {"ffn_hidden_size", 48}};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  const auto samples = at::randint(0, 64, {8, 9}, gen, at::kLong);
  testing::run_ranks(2, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = make_test_transformer(config);
    int frozen = 0;
    for (auto& [name, p] : model->named_parameters())
      if (is_frozen(name)) {
        p->requires_grad = false;
        ++frozen;
      }
    ASSERT_GT(frozen, 2);
    FsdpConfig options;
    options.apply_modules = {"layers.{*}"};
    Fsdp fsdp(*model, comm, options);
    fsdp.init_params(3);
    std::vector<at::Tensor> params, grads, before;
    for (auto* unit : fsdp.units()) {
      params.push_back(unit->shard_flat);
      grads.push_back(unit->grad_flat);
      before.push_back(unit->shard_flat.clone());
    }
    AdamW adamw(params, grads, {0.9, 0.95, 1e-8, 0.1});
    auto units = fsdp.units();
    int masked = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      auto mask = fsdp_trainable_mask(*units[u]);
      masked += mask.defined();
      adamw.set_update_mask(u, mask);
    }
    EXPECT_EQ(masked, 2);  // the root (embed frozen, lm_head/norm not) and layers.0

    for (int step = 0; step < 3; ++step) {
      fsdp.zero_grad();
      fsdp.begin_forward();
      auto out = model->forward(Batch{{"tokens", samples.narrow(0, comm->rank() * 4, 4)}});
      out.loss.backward();  // no NoGradGuard: autograd does produce grads for the frozen params
      fsdp.finish_backward();
      for (auto* unit : units)
        for (auto& p : unit->params)
          if (!p.param->requires_grad)
            EXPECT_EQ(unit->grad_flat.narrow(0, p.offset, p.layout.shard_numel()).abs().max().item<float>(), 0.0f)
                << p.name;
      fsdp.clip_grad_norm(1.0);
      adamw.step(1e-2);
    }
    for (size_t u = 0; u < units.size(); ++u)
      for (auto& p : units[u]->params) {
        auto now = units[u]->shard_flat.narrow(0, p.offset, p.layout.shard_numel());
        auto was = before[u].narrow(0, p.offset, p.layout.shard_numel());
        if (p.layout.rows(comm->rank()) == 0) continue;
        if (!p.param->requires_grad)
          EXPECT_TRUE(at::equal(now, was)) << p.name << " changed although frozen";
        else
          EXPECT_FALSE(at::equal(now, was)) << p.name << " did not train";
      }
  });
}

}  // namespace
}  // namespace mmtrain
