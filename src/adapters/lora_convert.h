// `mmtrain convert MODEL lora-to-peft | merge-lora`: what a LoRA run's checkpoint (adapters,
// modules_to_save, the base's identity; train/state.h) becomes for other tools.
//   lora-to-peft  HF peft's adapter directory: adapter_model.safetensors (metadata format: pt;
//                 keys base_model.model.<HF module>.lora_A.weight / lora_B.weight, and
//                 base_model.model.<HF key> for modules_to_save) and adapter_config.json
//                 (peft_type LORA, r, lora_alpha, use_rslora, target_modules, modules_to_save,
//                 base_model_name_or_path), which peft.PeftModel.from_pretrained and vLLM load.
//                 Layers with several modality experts have no PEFT form: refused.
//   peft-to-ckpt  the reverse of lora-to-peft: a peft adapter directory (read as a hostile file:
//                 size caps, checked types) becomes an iteration-0 LoRA checkpoint of the run a
//                 YAML describes (its base, its features.lora), whose training.load continues
//                 training from the adapter; r, lora_alpha, use_rslora, the adapted layers,
//                 the modules to save and every shape must agree with the config, by name.
//   merge-lora    the full weights W + scale * B A (per expert) in the model's public layout, as
//                 one model.safetensors (plus the base directory's other files), which model.
//                 model_name_or_path and the HF tools read. The base is the run's model weights,
//                 checked against the fingerprint the adapters were trained over (--base names
//                 it where it moved), or its random init. Streamed: one merged tensor in memory.
#pragma once
#include <string>

namespace mmtrain {

// base_model_name: adapter_config.json's base_model_name_or_path; empty: the run's weights path.
// base_dir: the base's weights where they are now (checked against the recorded fingerprint);
// empty: where the run loaded them from.
// ema (both exports): the adapters' and modules_to_save's EMA (training.ema) in place of their values.
void convert_lora_to_peft(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                          const std::string& base_model_name, const std::string& base_dir, bool overwrite,
                          bool ema = false);
// world_size: the ranks of the run that will load it (its global batch, as dcp-to-ckpt).
void convert_peft_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& peft_dir,
                          const std::string& save_dir, int world_size, bool overwrite);
// dtype: "public" writes each tensor in the dtype of the model's public checkpoint
// (Param::checkpoint_dtype: bf16 linears), "fp32" keeps the merged values whole.
void convert_merge_lora(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                        const std::string& dtype, const std::string& base_dir, bool overwrite, bool ema = false);

}  // namespace mmtrain
