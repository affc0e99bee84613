// `mmtrain convert MODEL hf-to-ckpt | ckpt-to-hf` for every model spec, between the model's
// public HF layout and mmtrain checkpoints (a spec's converter_alias and the
// aliases hf_to_dcp / dcp_to_hf give the seed's spellings). hf-to-ckpt writes a model-only checkpoint (training.load starts a fresh run from
// it); ckpt-to-hf restores the HF row layout and writes the same shard files, index, keys, order,
// shapes and dtypes as the reference directory, copying its other assets.
#pragma once
#include <string>

namespace mmtrain {

// config_path may be empty: the spec reads the config off the checkpoint directory.
void convert_hf_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& hf_dir,
                        const std::string& save_dir);
void convert_ckpt_to_hf(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                        const std::string& model_assets_dir);

}  // namespace mmtrain
