// The weights a command runs (`mmtrain eval`, `mmtrain sample`), given as one --load:
//   an mmtrain checkpoint   an iter_N directory (index.json) or a save root (latest)
//   an HF model directory   *.safetensors (with its index), or one .safetensors file
//   a PyTorch DCP           .metadata: its weights are converted (rank 0) into a model-only
//                           checkpoint in <output_dir>/<dcp_scratch_prefix><random>/ (core/scratch_dir.h),
//                           removed after, on an error and on SIGTERM / SIGINT / SIGHUP too
// A LoRA run's checkpoint loads over its base (the config's model), whose identity is checked.
#pragma once
#include "train/run.h"

#include <cstdint>
#include <string>

namespace mmtrain {

// Loads DIR's weights into run.model (run.config, run.runtime, run.model and run.fsdp set); returns
// the iteration they are of (0: not a training checkpoint). Errors start with `flag` ("eval --load").
// Collective.
// ema: a checkpoint's EMA weights (training.ema) in place of its trained weights; HF and DCP
// weights hold none (refused).
int64_t load_tool_weights(Run& run, const std::string& dir, const std::string& flag,
                          const std::string& dcp_scratch_prefix, bool ema = false);

}  // namespace mmtrain
