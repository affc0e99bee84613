// `mmtrain debug ...`: inspection commands that run one piece of the training pipeline alone.
// debug collate builds the dataset and collator of a config exactly as the trainer does and
// writes one micro-batch to a safetensors file, so a batch can be checked outside the trainer.
// debug step runs one forward + backward of the configured model on such a batch, on one
// process, and writes the loss, the named outputs ("prediction") and every trainable
// parameter's gradient in the HF layout (grad.<hf key>, fp32): what the parity tests compare
// against the PyTorch references.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

struct DebugCollateOptions {
  int64_t step = 0;   // optimizer step (0-based) whose data to collate
  int64_t micro = 0;  // micro-batch within the step (0 .. gradient_accumulation_steps-1)
  int rank = 0;       // data-parallel rank and world size the sampler and generator assume
  int world = 1;
};

// Writes the collated batch (keys sorted) to out_path, with metadata step, micro, rank, world,
// seed and sample_indices ("3,4": the dataset indices in the batch, in order).
void debug_collate(const std::string& config_path, const std::vector<std::string>& overrides,
                   const std::string& out_path, const DebugCollateOptions& options);

void debug_step(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& batch_path, const std::string& out_path);

}  // namespace mmtrain
