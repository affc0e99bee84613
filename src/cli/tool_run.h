// A command's run that trains nothing (eval, sample, a DCP conversion's ranks): its config, its
// process group, its model sharded as the config says, and the collective helpers such a command
// needs (rank 0 working while the others wait, a scratch directory every rank sees, a new output
// directory). Loading --load's weights in any format is convert/model_weights.h's.
#pragma once
#include "core/scratch_dir.h"
#include "train/run.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace mmtrain {

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
