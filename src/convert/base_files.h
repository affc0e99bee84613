// The files of a base model directory that come along to a model a command writes from it
// (merge-lora, quantize-base, dequantize-base, ckpt-to-hf): config.json, the tokenizer, the
// processor, the chat template. One rule for all of them (docs/security.md):
//   - never a weight file in any format (the output's own replace them: a loader that prefers
//     pytorch_model.bin would otherwise load the base's), nor a hidden file;
//   - a symlink is copied as the file it points to only when that is a regular file inside the
//     base's tree: the directory itself, or for an HF cache snapshot (<repo>/snapshots/<rev>, all
//     links into ../../blobs) the cached repository <repo>; any other link is named and skipped;
//   - a FIFO, device or directory is never read; each file is read through the checked open with a
//     cap and written without following a link at the destination.
#pragma once
#include <functional>
#include <string>

namespace mmtrain {

struct BaseFileOptions {
  // Also the weights' index (model.safetensors.index.json): ckpt-to-hf writes the same files.
  bool with_weight_index = false;
  // config.json's new content from its old (empty: copied as it is).
  std::function<std::string(const std::string&)> edit_config;
};

// Copies base_dir's other files into `to` (a new staging directory); `command` prefixes messages.
void copy_base_files(const std::string& base_dir, const std::string& to, const std::string& command,
                     const BaseFileOptions& options = {});

}  // namespace mmtrain
