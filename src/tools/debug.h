// `mmtrain debug step`: one forward + backward of the configured model on a batch read from a
// safetensors file, on one process; writes the loss, the named outputs ("prediction") and
// every trainable parameter's gradient in the HF layout (grad.<hf key>, fp32). The parity
// tests compare these against the PyTorch references.
#pragma once
#include <string>
#include <vector>

namespace mmtrain {

void debug_step(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& batch_path, const std::string& out_path);

}  // namespace mmtrain
