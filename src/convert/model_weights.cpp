#include "convert/model_weights.h"

#include "cli/tool_run.h"
#include "config/registries.h"
#include "convert/convert.h"
#include "core/error.h"
#include "core/scratch_dir.h"
#include "train/build.h"
#include "train/lora_base.h"
#include "train/state.h"

#include <filesystem>
#include <memory>

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

int64_t load_tool_weights(Run& run, const std::string& dir, const std::string& flag, const std::string& dcp_scratch_prefix,
                          bool ema) {
  const Config& c = run.config;
  StateLoadOptions options;
  options.model_id = c.model.model_id;
  options.model_config = c.model.config;
  options.execution_only_keys = config_model_spec(c).execution_only_keys;
  options.lora_base = lora_base(c, &run.comm());
  options.weights_from_ema = ema;
  const WeightsKind kind = kind_of(dir, flag);
  if (ema && kind != WeightsKind::checkpoint)
    fail(flag, " ", dir, " --ema: only an mmtrain checkpoint of a run with training.ema holds EMA weights");
  switch (kind) {
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

}  // namespace mmtrain
