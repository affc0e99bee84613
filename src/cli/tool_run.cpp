#include "tools/tool_model.h"

#include "config/registries.h"
#include "core/error.h"
#include "core/scratch_dir.h"
#include "dist/runtime.h"
#include "offload/offload_tiers.h"
#include "tools/convert.h"
#include "train/build.h"
#include "train/lora_base.h"
#include "train/state.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

namespace mmtrain {

namespace fs = std::filesystem;

namespace {

enum class WeightsKind { checkpoint, hf, dcp };

WeightsKind kind_of(const std::string& dir, const std::string& flag) {
  const fs::path path(dir);
  std::error_code error;
  if (fs::is_regular_file(path, error) && path.extension() == ".safetensors") return WeightsKind::hf;
  if (!fs::is_directory(path, error)) fail(flag, " ", dir, ": no such directory");
  if (fs::is_regular_file(path / ".metadata")) return WeightsKind::dcp;
  if (fs::is_regular_file(path / "index.json") || fs::is_regular_file(path / "latest")) return WeightsKind::checkpoint;
  for (const auto& entry : fs::directory_iterator(path))
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") return WeightsKind::hf;
  fail(flag, " ", dir, ": not a model's weights: expected an mmtrain checkpoint (an iter_N directory with ",
       "index.json, or a save root with latest), an HF model directory (*.safetensors) or a PyTorch DCP (.metadata)");
}

}  // namespace

int64_t load_tool_weights(Run& run, const std::string& dir, const std::string& flag, const std::string& dcp_scratch_prefix) {
  const Config& c = run.config;
  StateLoadOptions options;
  options.model_id = c.model.model_id;
  options.model_config = c.model.config;
  options.execution_only_keys = config_model_spec(c).execution_only_keys;
  options.lora_base = lora_base(c, &run.comm());
  switch (kind_of(dir, flag)) {
    case WeightsKind::checkpoint:
      if (!options.lora_base.is_null()) load_initial_weights(c, *run.model, *run.fsdp);  // the adapters' base
      return state_load_weights(dir, *run.model, *run.fsdp, options).iteration;
    case WeightsKind::hf: {
      Config with_weights = c;
      with_weights.model.checkpoint_path = dir;
      load_initial_weights(with_weights, *run.model, *run.fsdp);
      return 0;
    }
    case WeightsKind::dcp: {
      // Rank 0 converts the weights into a model-only checkpoint in a scratch directory of its own
      // (a random name, created exclusively, removed on every exit: scratch_dir.h); the others
      // learn its name, then wait for the conversion in short collectives, so a conversion longer
      // than parallel.timeout_s cannot expire their wait.
      const std::string& prefix = dcp_scratch_prefix;
      std::unique_ptr<ScratchDir> scratch;
      std::string failed;
      if (run.is_rank0()) {
        try {
          fs::create_directories(c.logging.output_dir);
          scratch = std::make_unique<ScratchDir>(c.logging.output_dir, prefix);
        } catch (const std::exception& e) {
          failed = e.what();
        }
      }
      if (run.comm().any_rank(!failed.empty())) {
        if (!run.is_rank0()) fail(flag, " ", dir, ": rank 0 could not create its scratch directory (see its error)");
        fail(flag, " ", dir, ": ", failed);
      }
      const RankScratchDir shared(run, std::move(scratch), c.logging.output_dir, prefix);
      const std::string staging = (fs::path(shared.path()) / "ckpt").string();
      on_rank0_while_others_wait(run, flag + " " + dir, [&] {
        convert_dcp_weights_to_ckpt(c.model.model_id, c.model.config, dir, staging);
      });
      state_load_weights(staging, *run.model, *run.fsdp, options);
      run.comm().barrier();  // every rank has read it before rank 0 removes it
      return 0;
    }
  }
  return 0;
}


Config load_tool_config(const std::string& path, const std::vector<std::string>& overrides, const std::string& model_id,
                        const std::string& what) {
  Config config = config_load(path, overrides);
  if (!model_id.empty() && config.model.model_id != model_id)
    fail(what, ": config ", path, " is a '", config.model.model_id, "' model");
  config.training.save.clear();
  config.training.load.clear();
  config.training.async_save = false;
  config.training.keep_best = 0;
  return config;
}

void start_tool_run(Run& run, Config config) {
  run.runtime = runtime_init(LaunchEnv::from_environment(), default_device(), std::chrono::seconds(config.parallel.timeout_s));
  run.config = std::move(config);
}

void on_rank0_while_others_wait(Run& run, const std::string& what, const std::function<void()>& work) {
  std::string failed;
  std::atomic<bool> done{!run.is_rank0()};
  std::thread worker;
  struct Join {  // an error while it runs still waits for it
    std::thread& thread;
    ~Join() {
      if (thread.joinable()) thread.join();
    }
  } join{worker};
  if (run.is_rank0())
    worker = std::thread([&] {
      try {
        work();
      } catch (const std::exception& e) {
        failed = e.what();
      }
      done = true;
    });
  while (run.comm().any_rank(!done.load())) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (worker.joinable()) worker.join();
  if (run.comm().any_rank(!failed.empty()))
    fail(what, ": ", run.is_rank0() ? failed : std::string("failed on rank 0 (see its error)"));
}

RankScratchDir::RankScratchDir(Run& run, std::unique_ptr<ScratchDir> own, const std::string& parent,
                               const std::string& prefix)
    : own_(std::move(own)) {
  ScratchDirIdentity identity{};
  if (own_) identity = own_->identity();
  const auto words = run.comm().all_reduce_sum(std::vector<double>(identity.begin(), identity.end()));
  std::copy(words.begin(), words.end(), identity.begin());
  std::string failed;
  if (!own_) {
    try {
      view_ = std::make_unique<ScratchDirView>(parent, prefix, identity);
    } catch (const std::exception& e) {
      failed = e.what();
    }
  }
  // Rank 0 keeps its directory until every rank could open it or has said why not.
  if (run.comm().any_rank(!failed.empty())) fail(failed.empty() ? "a rank could not open rank 0's scratch directory" : failed);
}

void make_new_output_dir(Run& run, const std::string& dir, const std::string& flag) {
  std::string refused;
  if (run.is_rank0()) {
    std::error_code error;
    if (fs::symlink_status(dir, error).type() != fs::file_type::not_found)
      refused = flag + " " + dir + " exists; give a new directory (nothing is ever overwritten)";
    else if (!fs::create_directories(dir, error) || error)
      refused = flag + " " + dir + ": cannot create it (" + error.message() + ")";
  }
  if (run.comm().any_rank(!refused.empty())) fail(run.is_rank0() ? refused : flag + ": refused by rank 0");
}

void build_tool_model(Run& run) {
  const ParallelDims dims = config_resolve_world(run.config, run.comm().world_size());
  run.mesh = std::make_unique<DeviceMesh>(build_mesh(dims, run.runtime));
  run.model = build_model(run.config);
  run.tiers = OffloadTiers::make(run.comm().device());
  run.fsdp = parallelize_model(run.config, *run.model, *run.mesh, run.tiers);
}

}  // namespace mmtrain
