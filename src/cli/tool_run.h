// The model a tool runs (`mmtrain eval`, `mmtrain sample`) and its weights, given as one --load:
//   an mmtrain checkpoint   an iter_N directory (index.json) or a save root (latest)
//   an HF model directory   *.safetensors (with its index), or one .safetensors file
//   a PyTorch DCP           .metadata: its weights are converted (rank 0) into a model-only
//                           checkpoint in <output_dir>/<dcp_scratch_prefix><random>/ (core/scratch_dir.h),
//                           removed after, on an error and on SIGTERM / SIGINT / SIGHUP too
// A LoRA run's checkpoint loads over its base (the config's model), whose identity is checked.
#pragma once
#include "core/scratch_dir.h"
#include "train/run.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

// Loads DIR's weights into run.model (run.config, run.runtime, run.model and run.fsdp set); returns
// the iteration they are of (0: not a training checkpoint). Errors start with `flag` ("eval --load").
// Collective.
int64_t load_tool_weights(Run& run, const std::string& dir, const std::string& flag,
                          const std::string& dcp_scratch_prefix);

// The config of a run for a tool that trains nothing (eval, sample): loaded with its overrides,
// saving and resuming off (the training's save root is not taken). A non-empty model_id is
// required of it, naming `what` otherwise.
Config load_tool_config(const std::string& path, const std::vector<std::string>& overrides, const std::string& model_id,
                        const std::string& what);

// run.config and run.runtime of a tool's run: the process group over torchrun's ranks (or one rank),
// on the default device, with the config's parallel.timeout_s.
void start_tool_run(Run& run, Config config);

// Runs work on rank 0 in a thread while every rank polls in short collectives, so a long step (a
// DCP conversion, a 9B text encoder loading) cannot expire parallel.timeout_s; rank 0's error
// reaches every rank, prefixed with `what`. Collective.
void on_rank0_while_others_wait(Run& run, const std::string& what, const std::function<void()>& work);

// A scratch directory rank 0 made (core/scratch_dir.h), seen by every rank: rank 0 through its own
// descriptor, the others through a ScratchDirView checked to be the same directory.
class RankScratchDir {
 public:
  // Collective. `own` is rank 0's directory in `parent` (null on the other ranks).
  RankScratchDir(Run& run, std::unique_ptr<ScratchDir> own, const std::string& parent, const std::string& prefix);
  const std::string& path() const { return own_ ? own_->path() : view_->path(); }

 private:
  std::unique_ptr<ScratchDir> own_;
  std::unique_ptr<ScratchDirView> view_;
};

// Rank 0 creates `dir`, refused (on every rank) when anything is there already. Collective.
void make_new_output_dir(Run& run, const std::string& dir, const std::string& flag);

// For a forward-only tool: the mesh, the model and its FSDP sharding as run.config says (no data,
// no optimizer), context parallelism included (the model splits its sequence over the CP ranks).
void build_tool_model(Run& run);

}  // namespace mmtrain
