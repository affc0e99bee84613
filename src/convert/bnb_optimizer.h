// `mmtrain convert MODEL ckpt-to-bnb`: the optimizer state of a training.optimizer adamw8bit
// checkpoint as bitsandbytes' AdamW8bit holds it, for a PyTorch user who continues there
// (docs/optimizer.md). One file, <save_dir>/optimizer.safetensors:
//   state.<hf name>.state1, .state2     uint8 codes (exp_avg, exp_avg_sq), the param's HF shape; or
//                                       fp32 moments for a param below min_8bit_size
//   state.<hf name>.absmax1, .absmax2   fp32 [ceil(numel / 256)], 8-bit params only
//   qmap1, qmap2                        the signed and unsigned dynamic maps, fp32 [256]
//   metadata: format "bitsandbytes.optim.AdamW8bit", step, lr (the schedule's at the checkpoint),
//             betas, eps, weight_decay, min_8bit_size (JSON), params (the HF names, in order)
// python/mmtrain_py/bnb_optimizer.py loads it into a bnb.optim.AdamW8bit (load_state_dict), and
// writes it from one (save_state).
//
// `mmtrain convert MODEL bnb-to-ckpt` goes the other way: such a file and the HF weights it goes
// with become a training checkpoint at iteration = its step, for the run of --config (whose
// training.optimizer must be adamw8bit with the file's min_8bit_size, and whose betas, eps and
// weight_decay must be the file's), so that a run begun in PyTorch continues in mmtrain.
// A param whose HF rows are laid out otherwise than the training rows (the adapter's
// layout_differs) has its 8-bit moments dequantized, reordered and quantized again by
// bitsandbytes' rule: close, not bitwise (the blocks hold other elements); the others are copied.
#pragma once
#include <string>

namespace mmtrain {

void convert_ckpt_to_bnb(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                         bool overwrite);
// world_size: the ranks of the run that resumes (its global batch when the config sets none).
void convert_bnb_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& hf_dir,
                         const std::string& bnb_path, const std::string& save_dir, int world_size, bool overwrite);

}  // namespace mmtrain
