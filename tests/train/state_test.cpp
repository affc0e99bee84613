// train/state: the CPU RNG stream a rank saved comes back exactly, and a damaged one (missing,
// wrong type, bad hex, odd or wrong length) is an error naming the rank file and the key, not
// LibTorch's "Invalid mt19937 state"; the plan entry the trainer and convert write.
#include "train/state.h"

#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/sharded_checkpoint.h"
#include "fsdp/shard_pager.h"
#include "offload/disk_store.h"
#include "offload/offload_tiers.h"
#include "models/test_transformer/model.h"
#include "multirank_harness.h"
#include "parallel/parallelize.h"
#include "test_util.h"
#include "train/build.h"
#include "record/memory_profile.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <mutex>

namespace mmtrain {
namespace {

std::string hex_of(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (int64_t i = 0; i < bytes.numel(); ++i) {
    const auto b = bytes.data_ptr<uint8_t>()[i];
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// A one-rank checkpoint under root/<name> whose rank_state is `state`.
std::string save_with_rank_state(const testing::TempDir& root, const std::string& name, const nlohmann::json& state) {
  Comm comm(nullptr, 0, 1);
  const std::string save_root = root / name;
  checkpoint_save(save_root, 1, comm, {{"w", {2}, 0, at::ones({2})}}, {{"iteration", 1}}, state, {});
  return save_root;
}

TEST(StateRng, TheSavedStreamComesBack) {
  testing::TempDir root;
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const auto saved = generator.get_state();
  const auto path = save_with_rank_state(root, "good", {{"cpu_rng_state", hex_of(saved)}});
  const auto expected = at::randn({4}, generator);  // what the stream draws next
  state_restore_rng(CheckpointReader(path), 0);
  EXPECT_TRUE(at::equal(at::randn({4}, generator), expected));
}

TEST(StateRng, DamagedStatesNameFileAndKey) {
  testing::TempDir root;
  const std::string good = hex_of(at::detail::getDefaultCPUGenerator().get_state());
  struct Case {
    const char* name;
    nlohmann::json state;
    std::string message;
  };
  const Case cases[] = {
      {"missing", nlohmann::json::object(), "rank_state.cpu_rng_state: missing"},
      {"not_object", nlohmann::json::array(), "rank_state.cpu_rng_state: missing"},
      {"number", {{"cpu_rng_state", 12}}, "rank_state.cpu_rng_state: expected a hex string, found 12"},
      {"odd", {{"cpu_rng_state", "abc"}}, "expected an even number of hex digits, found 3"},
      {"bad_digit", {{"cpu_rng_state", "zz" + good.substr(2)}}, "expected hex digits 0-9a-f, found 'z' at position 0"},
      {"short", {{"cpu_rng_state", good.substr(0, 20)}}, "bytes (" + std::to_string(good.size()) + " hex digits), found 10"},
  };
  for (const auto& c : cases) {
    const auto path = save_with_rank_state(root, c.name, c.state);
    CheckpointReader reader(path);
    const auto message = testing::error_of([&] { state_restore_rng(reader, 0); });
    EXPECT_CONTAINS(message, "checkpoint " + reader.rank_file(0) + ": rank_state.cpu_rng_state") << c.name;
    EXPECT_CONTAINS(message, c.message) << c.name;
  }
}

// Two thread ranks save iteration 1, then rank 1's moments get a NaN and they save iteration 2
// with `save2`; returns each rank's error.
template <typename Save>
std::vector<std::string> errors_saving_nan_moments(const std::string& root, Save save2) {
  std::vector<std::string> errors(2);
  std::mutex mutex;
  testing::run_ranks(2, [&](Comm& comm_ref) {
    std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
    auto model = make_test_transformer({{"vocab_size", 64}, {"hidden_size", 16}, {"num_layers", 1},
                                        {"num_heads", 2}, {"num_kv_heads", 1}, {"ffn_hidden_size", 24}});
    auto fsdp = parallelize(*model, ParallelizePlan{}, comm);
    fsdp->init_params(1);
    auto adamw = make_fsdp_adamw(*fsdp, AdamWOptions{});
    StateInfo info;
    info.model_id = "test_transformer";
    info.config = {{"model", {{"model_id", "test_transformer"}}}};
    info.iteration = 1;
    state_save(root, *comm, *model, *fsdp, adamw.get(), info);
    if (comm->rank() == 1) adamw->moments(0).exp_avg_sq[5].fill_(std::numeric_limits<float>::quiet_NaN());
    info.iteration = 2;
    const auto error = testing::error_of([&] { save2(*comm, *model, *fsdp, *adamw, info); });
    std::lock_guard<std::mutex> lock(mutex);
    errors[comm->rank()] = error;
  });
  return errors;
}

void expect_latest_still_iteration_1(const testing::TempDir& root) {
  EXPECT_EQ(testing::read_bytes(root / "latest"), "iter_0000001\n");
  EXPECT_NO_THROW(CheckpointReader(root.str()).verify());
}

// A save from NaN weights or moments is refused on every rank: the rank that holds them names the
// tensor before its file is written, so the checkpoint is never committed; `latest` keeps naming
// the last good checkpoint, which still verifies.
TEST(StateSave, RefusesNonFiniteStateOnEveryRank) {
  testing::TempDir root;
  const auto errors = errors_saving_nan_moments(root.str(), [&](Comm& comm, Model& model, Fsdp& fsdp, AdamW& adamw,
                                                                const StateInfo& info) {
    state_save(root.str(), comm, model, fsdp, &adamw, info);
  });
  EXPECT_CONTAINS(errors[1], "checkpoint of iteration 2 not written: tensor 'optim.exp_avg_sq.");
  EXPECT_CONTAINS(errors[1], "holds nan (element ");
  EXPECT_CONTAINS(errors[1], "of rank 1's rows); refusing to save non-finite state (`latest` keeps naming the previous");
  EXPECT_CONTAINS(errors[0], "rank 1 did not write rank_00001.safetensors (rank 1's error says why)");
  EXPECT_FALSE(std::filesystem::exists(root / "iter_0000002"));
  expect_latest_still_iteration_1(root);
}

// The asynchronous save checks the staged copy on its background thread: start() returns, and
// the refusal stops every rank at the next poll/wait, naming the tensor on rank 1.
TEST(StateSave, AsyncSaveRefusesNonFiniteStateInTheBackground) {
  testing::TempDir root;
  const auto errors = errors_saving_nan_moments(root.str(), [&](Comm& comm, Model& model, Fsdp& fsdp, AdamW& adamw,
                                                                const StateInfo& info) {
    AsyncCheckpointSaver saver(comm);
    state_save_async(saver, root.str(), comm, model, fsdp, adamw, info, 0);
    saver.wait();
  });
  EXPECT_CONTAINS(errors[1], "checkpoint iter_0000002: the background write of the rank files failed: checkpoint of "
                             "iteration 2 not written: tensor 'optim.exp_avg_sq.");
  EXPECT_CONTAINS(errors[1], "of rank 1's rows); refusing to save non-finite state");
  EXPECT_CONTAINS(errors[0], "failed on rank 1 (that rank's error says why)");
  EXPECT_FALSE(std::filesystem::exists(root / "iter_0000002"));
  expect_latest_still_iteration_1(root);
}

// Shards and moments on the disk tier (fsdp cpu_offload and adamw_swap with an offload_dir): a save
// pages the shards through the two pool buffers the step holds for them (the unit in use, the next
// read ahead) and reads one tensor's moments at a time; a resume fills a unit at a time. Measured
// as the host pool's peak and ATen's allocated peak (tools.memory_profile's counting allocator)
// over each; and the resumed state is the saved one.
TEST(StateSave, AnOffloadedSaveHoldsOneTensorAndAResumeOneUnitAtATime) {
  testing::TempDir root, offload;
  struct Run {
    std::shared_ptr<OffloadTiers> tiers = OffloadTiers::make(at::kCPU);
    std::shared_ptr<Model> model;
    std::unique_ptr<Fsdp> fsdp;
    std::unique_ptr<AdamW> adamw;
  };
  Comm comm_ref(nullptr, 0, 1);
  std::shared_ptr<Comm> comm(&comm_ref, [](Comm*) {});
  auto make_run = [&] {
    Run run;
    run.tiers->disk = std::make_shared<DiskStore>(offload.str(), 0, run.tiers->host_pool);
    run.model = make_test_transformer({{"vocab_size", 64}, {"hidden_size", 32}, {"num_layers", 4}, {"num_heads", 2},
                                       {"num_kv_heads", 1}, {"ffn_hidden_size", 64}});
    ParallelizePlan plan;
    plan.fsdp.apply_modules = {"layers.{*}"};
    plan.fsdp.cpu_offload = true;
    run.fsdp = parallelize(*run.model, plan, comm, at::kCPU, run.tiers);
    run.adamw = make_fsdp_adamw(*run.fsdp, AdamWOptions{}, run.tiers);
    run.adamw->offload_moments(run.tiers->disk, DiskStore::kFloatsPerBlock);
    return run;
  };
  Run saved = make_run();
  saved.fsdp->init_params(3);
  int64_t largest_unit = 0, all_units = 0;  // fp32 bytes of one unit's shard
  for (auto* unit : saved.fsdp->units()) {
    const int64_t bytes = unit->shard_flat.numel() * static_cast<int64_t>(sizeof(float));
    largest_unit = std::max(largest_unit, bytes);
    all_units += bytes;
  }
  ASSERT_GT(all_units, 3 * largest_unit);  // else one unit's worth would prove nothing
  for (size_t u = 0; u < saved.fsdp->units().size(); ++u) {  // moments worth saving: distinct per unit
    const auto numel = saved.fsdp->units()[u]->shard_flat.numel();
    saved.adamw->set_moments(u, at::full({numel}, 0.5 + u), at::full({numel}, 2.0 + u));
  }
  // Pool: two units' shards, in whole pages. ATen: a save holds one tensor's moment (its block-
  // aligned read) at a time; a resume stages one unit's two moments and reads a tensor's rows.
  const int64_t two_shards = 2 * (largest_unit + 4096);
  int64_t largest_param = 0;  // fp32 bytes of this rank's rows of the largest param
  for (auto* unit : saved.fsdp->units())
    for (const auto& p : unit->params) largest_param = std::max(largest_param, p.layout.shard_numel() * 4);
  ASSERT_GT(largest_unit, 2 * largest_param);  // else one tensor's worth would prove nothing
  MemoryProfileConfig profile;
  profile.enable = true;
  MemoryProfile counting_allocator(profile);
  StateInfo info;
  info.model_id = "test_transformer";
  info.config = {{"model", {{"model_id", "test_transformer"}, {"config", nlohmann::json::object()}}}};
  info.iteration = 1;
  info.global_batch_size = 1;
  saved.tiers->host_pool->reset_peak_held_bytes();
  const int64_t held = saved.tiers->host_pool->held_bytes();
  reset_allocation_peak();
  const int64_t live = live_allocated_bytes();
  state_save(root.str(), *comm, *saved.model, *saved.fsdp, saved.adamw.get(), info);
  EXPECT_LE(saved.tiers->host_pool->peak_held_bytes() - held, two_shards)
      << "the save paged in more than two units' shards (all units: " << all_units << " bytes)";
  EXPECT_LE(peak_allocated_bytes() - live, largest_param + 2 * 4096 + 65536)
      << "the save held more than one tensor's moment (all moments: " << 2 * all_units << " bytes)";

  Run resumed = make_run();
  resumed.tiers->host_pool->reset_peak_held_bytes();
  const int64_t resumed_held = resumed.tiers->host_pool->held_bytes();
  reset_allocation_peak();
  const int64_t resumed_live = live_allocated_bytes();
  StateLoadOptions options;
  options.model_id = "test_transformer";
  options.global_batch_size = 1;
  options.model_config = nlohmann::json::object();
  state_load(root.str(), *comm, *resumed.model, *resumed.fsdp, *resumed.adamw, options);
  EXPECT_LE(resumed.tiers->host_pool->peak_held_bytes() - resumed_held, two_shards)
      << "the resume paged in more than two units' shards";
  EXPECT_LE(peak_allocated_bytes() - resumed_live, 4 * largest_unit + 65536)
      << "the resume held more than one unit's moments, its write buffer and a tensor's rows";
  for (size_t u = 0; u < saved.fsdp->units().size(); ++u) {
    const auto before = saved.adamw->moments(u), after = resumed.adamw->moments(u);
    EXPECT_TRUE(testing::bitwise_equal(after.exp_avg, before.exp_avg)) << "unit " << u;
    EXPECT_TRUE(testing::bitwise_equal(after.exp_avg_sq, before.exp_avg_sq)) << "unit " << u;
  }
  const auto weights = [](Fsdp& fsdp) {
    std::vector<at::Tensor> out;
    for (auto* unit : fsdp.units()) {
      const bool paged = !fsdp.shard_resident(*unit);
      if (paged) fsdp.shard_pager()->page_in(*unit);
      out.push_back(unit->shard_flat.clone());
      if (paged) fsdp.shard_pager()->page_out(*unit, /*changed=*/false);
    }
    return out;
  };
  const auto saved_weights = weights(*saved.fsdp), resumed_weights = weights(*resumed.fsdp);
  for (size_t u = 0; u < saved_weights.size(); ++u)
    EXPECT_TRUE(testing::bitwise_equal(resumed_weights[u], saved_weights[u])) << "unit " << u;
}

TEST(StatePlanEntry, NamesTheShardingTheTrainerUsed) {
  FsdpConfig plan;
  plan.apply_modules = {"layers.{*}"};
  plan.param_dtype = at::kBFloat16;
  const auto entry = state_plan_entry(plan);
  EXPECT_EQ(entry["apply_modules"], nlohmann::json::array({"layers.{*}"}));
  EXPECT_EQ(entry["param_dtype"], "bf16");
  EXPECT_EQ(entry["reduce_dtype"], "fp32");
  EXPECT_EQ(entry["sharding"], "dim0 torch.chunk");
}

}  // namespace
}  // namespace mmtrain
