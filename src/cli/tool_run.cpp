#include "cli/tool_run.h"

#include "config/registries.h"
#include "core/error.h"
#include "core/scratch_dir.h"
#include "dist/runtime.h"
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
