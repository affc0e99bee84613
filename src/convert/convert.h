// `mmtrain convert MODEL hf-to-ckpt | ckpt-to-hf` for every model spec, between the model's
// public HF layout and mmtrain checkpoints (a spec's converter_alias and the
// aliases hf_to_dcp / dcp_to_hf give the seed's spellings). hf-to-ckpt writes a model-only checkpoint (training.load starts a fresh run from
// it); ckpt-to-hf restores the HF row layout and writes the same shard files, index, keys, order,
// shapes and dtypes as the reference directory, copying its other assets.
#pragma once
#include "checkpoint/sharded_checkpoint.h"
#include "models/model_spec.h"

#include <nlohmann/json.hpp>

#include <memory>

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace mmtrain {

// `mmtrain convert MODEL`, where each room that converts adds its verbs (this room: hf-to-ckpt,
// ckpt-to-hf, dcp-to-ckpt, ckpt-to-dcp; adapters/: the LoRA and quantized-base verbs).
CLI::App* convert_command_of(CLI::App& app, const std::string& model_id);
inline constexpr const char* kOverwriteHelp =
    "replace what --save_dir holds (without it, a non-empty --save_dir is refused)";

// config_path may be empty: the spec reads the config off the checkpoint directory. Every
// conversion writes save_dir through a ConversionOutput (convert/conversion_output.h): locked, a
// non-empty save_dir refused unless overwrite, staged and moved into place only when complete.
void convert_hf_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& hf_dir,
                        const std::string& save_dir, bool overwrite);
// ema: the checkpoint's EMA weights (training.ema) in place of its trained weights.
void convert_ckpt_to_hf(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                        const std::string& model_assets_dir, bool overwrite, bool ema = false);

// A checkpoint of model_id opened for export (`command` names the caller in errors): its reader,
// the model built from the config it records, and the model's HF adapter. A checkpoint of another
// model is an error.
struct CheckpointOfModel {
  std::unique_ptr<CheckpointReader> reader;
  std::shared_ptr<Model> model;
  std::shared_ptr<const HfAdapter> adapter;
};
CheckpointOfModel open_checkpoint_of(const std::string& model_id, const std::string& load_dir, const std::string& command);

// PyTorch Distributed Checkpoints (convert/dcp_convert.cpp), read and written by PyTorch's own DCP
// code (mmtrain_py.dcp.bridge). dcp-to-ckpt takes the model's weights ("model.<name>" or
// "<name>"), AdamW moments and step ("optim.state.<name>.exp_avg|exp_avg_sq|step", also under
// "optimizer."), train_state.step as the iteration; param-group hyperparameters must equal the run
// config's; lr_scheduler entries are accepted (the schedule is a function of the iteration); any
// other key is refused unless a --drop pattern (fnmatch) names it. The checkpoint is the one the
// run of config_path would have saved on world_size ranks (0: the ranks that wrote the DCP), its
// global batch config_global_batch's. ckpt-to-dcp writes the layout
// torch.distributed.checkpoint.state_dict's get_state_dict gives under {"model", "optim", "train_state"}.
// The layout of the DCP's tensors: the model's training layout (MindSpeed-MM's: gated-MLP rows
// de-interleaved where the adapter says so), or the public HF one (a port that trains on the HF rows).
// dcp-to-ckpt reads either naming in both; ckpt-to-dcp names parameters by their HF keys with hf
// and by mmtrain's names with training.
enum class DcpLayout { training, hf };
void convert_dcp_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& load_dir,
                         const std::string& save_dir, const std::vector<std::string>& drop_patterns, int world_size,
                         DcpLayout layout, bool overwrite);
void convert_ckpt_to_dcp(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                         DcpLayout layout, bool overwrite);
// A DCP directory (it holds .metadata): ckpt-to-hf (and its seed spelling dcp_to_hf) accepts one,
// taking only its weights, through a model-only checkpoint written by this into save_dir (a
// staging directory of the caller's; returns its iter dir).
bool is_dcp_dir(const std::string& dir);
std::string convert_dcp_weights_to_ckpt(const std::string& model_id, const nlohmann::json& model_config,
                                        const std::string& load_dir, const std::string& save_dir);

}  // namespace mmtrain
