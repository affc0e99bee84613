// `convert MODEL quantize-base` and `dequantize-base` (docs/qlora.md): an HF directory's frozen-base
// Linear weights written once in a quantized format, and back. The Linear weights quantized are
// those the model can adapt with LoRA (ModelSpec::lora_supported_targets), each in its HF layout,
// one source file at a time (one bf16 tensor at a time in memory beside the file's quantized
// tensors): the same file names, an index, config.json and the other files copied, and for nf4
// the bitsandbytes layout and a transformers quantization_config, so that transformers and peft
// load the directory as a `-bnb-4bit` checkpoint. Every mmtrain command that reads HF weights
// reads either directory (train/hf_weights.h).
#pragma once
#include "quant/quantized_weight.h"

#include <string>

namespace mmtrain {

// config.json's text without its quantization_config (what a plain model's loader reads; a config
// without one is returned as it is); fails naming `command` when it is not a JSON object.
std::string config_without_quantization(const std::string& text, const std::string& command);

void convert_quantize_base(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                           quant::BaseQuant kind, bool overwrite);
// Every quantized weight dequantized into its public dtype (nf4: the one it records; the 8-bit
// formats: `dtype`, default bf16).
void convert_dequantize_base(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                             at::ScalarType dtype_8bit, bool overwrite);

}  // namespace mmtrain
