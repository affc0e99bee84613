// `mmtrain debug optimizer-steps`: the 8-bit AdamW (optim/adamw8bit.h) stepped on given params and
// grads over the FSDP shards of however many ranks torchrun starts, with a checkpoint after every
// step: what tests/parity/test_adamw8bit_bnb.py compares with bitsandbytes' AdamW8bit fed the same
// tensors. The params form one FSDP unit (the root), so their shards cut them at row boundaries
// wherever W puts them, inside blocks too.
//
// Input, one safetensors file: param.<name> (fp32, any shape with dim 0) and grad.<k>.<name> for
// every step k = 1..steps (the param's shape). Output: <save>/iter_<k> for each k, holding
// model.<name> and the optimizer state (train/state_adamw8bit.h), trainer_state.json iteration k.
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain {

struct DebugOptimizerOptions {
  std::string tensors_path, save_dir;
  int64_t steps = 1;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  int64_t min_8bit_size = 4096;
};

void debug_optimizer_steps(const DebugOptimizerOptions& options);

}  // namespace mmtrain
