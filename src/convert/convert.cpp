#include "convert/convert.h"

#include "checkpoint/sharded_checkpoint.h"
#include "cli/command.h"
#include "config/config.h"
#include "convert/base_files.h"
#include "convert/bnb_optimizer.h"
#include "convert/conversion_output.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "models/model_spec.h"
#include "train/hf_weights.h"
#include "train/state.h"

#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

// model.config from --config when given, else from the checkpoint directory itself.
nlohmann::json model_config_for(const ModelSpec& spec, const std::string& config_path, const std::string& hf_dir) {
  if (!config_path.empty()) {
    auto config = config_load(config_path);
    if (config.model.model_id != spec.name)
      fail("convert ", spec.name, ": ", config_path, " configures model '", config.model.model_id, "'");
    return config.model.config;
  }
  if (!spec.config_from_checkpoint)
    fail("convert ", spec.name, " hf-to-ckpt: this model cannot read its config off ", hf_dir,
         "; give --config with the model's model.config");
  return spec.config_from_checkpoint(hf_dir);
}

}  // namespace

void convert_hf_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& hf_dir,
                        const std::string& save_dir, bool overwrite) {
  ConversionOutput output(save_dir, overwrite, "hf-to-ckpt");
  const auto& spec = model_spec(model_id, "convert");
  WeightSource source(hf_dir);
  const auto model_config = model_config_for(spec, config_path, hf_dir);
  auto model = spec.build(model_config);
  auto comm = std::make_shared<Comm>(nullptr, 0, 1);
  const FsdpConfig plan;  // one unit, fp32: the layout every world size reshards from
  Fsdp fsdp(*model, comm, plan);
  const int64_t conversions = load_hf_weights(*model, *make_hf_adapter(spec, model_config), fsdp, source);
  StateInfo info;
  info.model_id = model_id;
  info.config = {{"model", {{"model_id", model_id}, {"config", model_config}}}};
  info.extra = {{"source", hf_dir}};
  info.plan = state_plan_entry(plan);
  info.plan["converted_from"] = "hf";
  const auto dir = state_save(output.staging(), *comm, *model, fsdp, nullptr, info);
  output.commit();
  std::printf("hf-to-ckpt: %s -> %s (%lld tensors with a converted layout)\n", hf_dir.c_str(),
              (fs::path(save_dir) / fs::path(dir).filename()).c_str(), static_cast<long long>(conversions));
}

namespace {

// ckpt-to-hf from an mmtrain checkpoint into out_dir (a conversion's staging directory).
void write_hf_directory(const std::string& model_id, const std::string& load_dir, const std::string& out_dir,
                        const std::string& save_dir, const std::string& model_assets_dir, bool ema) {
  const auto opened = open_checkpoint_of(model_id, load_dir, "ckpt-to-hf");
  const CheckpointReader& reader = *opened.reader;
  if (ema && !reader.global_state().contains("ema"))
    fail("ckpt-to-hf --ema: ", reader.dir(), " holds no EMA weights (it was trained without training.ema)");
  const auto& model = opened.model;
  const auto& adapter = opened.adapter;
  SafetensorsIndex reference(model_assets_dir);

  // HF key -> parameter name, under every naming scheme the model loads (its adapter's legacy
  // aliases too): the output keeps the reference's own names.
  std::map<std::string, std::string> param_of_key;
  const auto params = model->named_parameters();
  for (auto& [name, param] : params) {
    param_of_key[adapter->hf_key(name)] = name;
    for (const auto& alias : adapter->hf_key_aliases(name)) param_of_key[alias] = name;
  }
  std::set<std::string> written;
  for (const auto& key : reference.names()) {
    if (!param_of_key.count(key)) fail("ckpt-to-hf: reference ", model_assets_dir, " has key '", key, "' the model lacks");
    if (!written.insert(param_of_key.at(key)).second)
      fail("ckpt-to-hf: reference ", model_assets_dir, " names parameter '", param_of_key.at(key), "' twice (key '", key, "')");
  }
  if (written.size() != params.size())
    fail("ckpt-to-hf: reference ", model_assets_dir, " has ", reference.names().size(), " tensors, the model ", params.size());

  int64_t conversions = 0;
  for (const auto& file_name : reference.file_names()) {
    SafetensorsFile ref_file((fs::path(model_assets_dir) / file_name).string());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& key : ref_file.names()) {
      const auto& name = param_of_key.at(key);
      // --ema: the trained params' shadows; a frozen param (or a buffer) has none and is its weight.
      const bool shadowed = ema && reader.contains(state_ema_key(name));
      auto full = reader.read_full(shadowed ? state_ema_key(name) : state_model_key(name));
      if (adapter->layout_differs(name)) ++conversions;
      tensors.emplace_back(key, adapter->to_hf_layout(name, full).to(ref_file.info(key).dtype).contiguous());
    }
    safetensors_write((fs::path(out_dir) / file_name).string(), tensors, ref_file.metadata());
    std::printf("ckpt-to-hf: wrote %s (%zu tensors)\n", file_name.c_str(), tensors.size());
  }
  if (conversions != adapter->expected_layout_conversions())
    fail("ckpt-to-hf: restored the layout of ", conversions, " tensors, the config expects ",
         adapter->expected_layout_conversions());
  // Everything else in the reference (index, config.json, ...) is copied as it is: the index
  // maps the same keys to the same file names.
  copy_base_files(model_assets_dir, out_dir, "ckpt-to-hf", {.with_weight_index = true});
  std::printf("ckpt-to-hf: %s -> %s (%lld tensors with a restored layout)\n", reader.dir().c_str(), save_dir.c_str(),
              static_cast<long long>(conversions));
}

}  // namespace

void convert_ckpt_to_hf(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                        const std::string& model_assets_dir, bool overwrite, bool ema) {
  const auto& spec = model_spec(model_id, "convert");
  ConversionOutput output(save_dir, overwrite, "ckpt-to-hf");
  const std::string& out_dir = output.staging();
  if (is_dcp_dir(load_dir)) {
    // A PyTorch DCP (MindSpeed-MM's training checkpoints): its weights through a model-only
    // checkpoint in the staging directory, the model's config read off the reference directory.
    if (ema) fail("ckpt-to-hf --ema: ", load_dir, " is a PyTorch DCP checkpoint, which holds no mmtrain EMA weights");
    if (!spec.config_from_checkpoint)
      fail("ckpt-to-hf: ", load_dir, " is a DCP checkpoint, and model '", model_id,
           "' cannot read its config off ", model_assets_dir, "; convert it with dcp-to-ckpt --config first");
    const std::string staged = (fs::path(output.staging()) / "from_dcp").string();
    const auto dir = convert_dcp_weights_to_ckpt(model_id, spec.config_from_checkpoint(model_assets_dir), load_dir, staged);
    write_hf_directory(model_id, dir, out_dir, save_dir, model_assets_dir, false);
    fs::remove_all(staged);  // not part of the output
  } else {
    write_hf_directory(model_id, load_dir, out_dir, save_dir, model_assets_dir, ema);
  }
  output.commit();
}

CheckpointOfModel open_checkpoint_of(const std::string& model_id, const std::string& load_dir, const std::string& command) {
  const auto& spec = model_spec(model_id, "convert");
  CheckpointOfModel out;
  out.reader = std::make_unique<CheckpointReader>(load_dir);
  const auto& global = out.reader->global_state();
  if (global.value("model_id", "") != model_id)
    fail(command, ": ", out.reader->dir(), " holds model '", global.value("model_id", ""), "', not '", model_id, "'");
  if (global.contains("lora_base"))
    fail(command, ": ", out.reader->dir(), " is a LoRA checkpoint (adapters without their base): convert it with ",
         "lora-to-peft, or merge-lora for full weights");
  const auto& model_config = global.at("config").at("model").at("config");
  out.model = spec.build(model_config);
  out.adapter = make_hf_adapter(spec, model_config);
  return out;
}

CLI::App* convert_command_of(CLI::App& app, const std::string& model_id) {
  auto* convert = subcommand_of(app, "convert", "convert checkpoints: the public HF layout and PyTorch DCP to and from "
                                                "mmtrain checkpoints, LoRA adapters, quantized bases");
  const auto& spec = model_spec(model_id);
  auto* model_cmd = subcommand_of(
      *convert, model_id, spec.title + (spec.converter_alias.empty() ? "" : " (seed spelling: " + spec.converter_alias + ")"));
  if (!spec.converter_alias.empty() && model_cmd->get_aliases().empty()) model_cmd->alias(spec.converter_alias);
  return model_cmd;
}

void add_convert_commands(CLI::App& app, Commands& commands) {
  for (const auto& name : model_spec_registry().names()) {
    struct Options {
      std::string hf_dir, save_dir, load_dir, assets_dir, config_path;
      std::vector<std::string> drop;
      int world_size = 0;
      std::string layout = "training";
      bool overwrite = false;
      bool ema = false;
      std::string bnb_path;
    };
    auto o = std::make_shared<Options>();
    auto* model_cmd = convert_command_of(app, name);
    auto* to_ckpt = model_cmd->add_subcommand("hf-to-ckpt", "HF directory -> model-only checkpoint");
    to_ckpt->alias("hf_to_dcp");
    to_ckpt->add_option("--hf_dir", o->hf_dir, "HF directory (safetensors shards + index)")->required();
    to_ckpt->add_option("--save_dir", o->save_dir, "checkpoint root to write (iter_0000000 + latest)")->required();
    to_ckpt->add_option("--config", o->config_path,
                        "YAML whose model.config describes the model (default: read off the directory: its "
                        "config.json or tensor shapes)");
    auto* to_hf = model_cmd->add_subcommand("ckpt-to-hf", "checkpoint (or a PyTorch DCP's weights) -> HF layout like the reference");
    to_hf->alias("dcp_to_hf");
    to_hf->add_option("--load_dir", o->load_dir, "checkpoint iter_N directory or save root, or a DCP directory")
        ->required();
    to_hf->add_option("--save_dir", o->save_dir, "output HF directory")->required();
    to_hf->add_flag("--ema", o->ema, "the checkpoint's EMA weights (training.ema) in place of its trained weights");
    to_hf->add_option("--model_assets_dir", o->assets_dir,
                      "reference HF directory: shard names, key order, dtypes, other files")
        ->required();
    auto* from_dcp = model_cmd->add_subcommand("dcp-to-ckpt", "PyTorch DCP checkpoint -> mmtrain checkpoint");
    from_dcp->add_option("--load_dir", o->load_dir, "DCP directory (.metadata + .distcp files)")->required();
    from_dcp->add_option("--save_dir", o->save_dir, "checkpoint root to write")->required();
    from_dcp->add_option("--config", o->config_path, "YAML of the run that will resume from it")->required();
    from_dcp->add_option("--drop", o->drop, "leave DCP keys matching this shell pattern out (repeatable)");
    from_dcp->add_option("--world-size,--world_size", o->world_size,
                         "ranks of the run that wrote the DCP, for its global batch when training.global_batch_size "
                         "is not set (0: counted from the DCP's __<rank>_<n>.distcp files)")
        ->capture_default_str();
    const std::string layout_help =
        "row layout of the DCP's tensors: training (the model's training layout, MindSpeed-MM's) or hf (the public HF rows)";
    from_dcp->add_option("--layout", o->layout, layout_help)->check(CLI::IsMember({"training", "hf"}))->capture_default_str();
    auto* to_dcp = model_cmd->add_subcommand("ckpt-to-dcp", "mmtrain checkpoint -> PyTorch DCP checkpoint");
    to_dcp->add_option("--layout", o->layout, layout_help)->check(CLI::IsMember({"training", "hf"}))->capture_default_str();
    to_dcp->add_option("--load_dir", o->load_dir, "checkpoint iter_N directory or save root")->required();
    to_dcp->add_option("--save_dir", o->save_dir, "DCP directory to write")->required();
    auto* to_bnb = model_cmd->add_subcommand("ckpt-to-bnb", "adamw8bit checkpoint -> bitsandbytes AdamW8bit state (HF names)");
    to_bnb->add_option("--load_dir", o->load_dir, "checkpoint iter_N directory or save root")->required();
    to_bnb->add_option("--save_dir", o->save_dir, "directory to write optimizer.safetensors into")->required();
    auto* from_bnb = model_cmd->add_subcommand("bnb-to-ckpt", "bitsandbytes AdamW8bit state + HF weights -> training checkpoint");
    from_bnb->add_option("--hf_dir", o->hf_dir, "HF directory of the weights the state goes with")->required();
    from_bnb->add_option("--bnb", o->bnb_path, "optimizer.safetensors (mmtrain_py.bnb_optimizer.save_state, ckpt-to-bnb)")->required();
    from_bnb->add_option("--config", o->config_path, "YAML of the run that will resume from it (training.optimizer adamw8bit)")->required();
    from_bnb->add_option("--save_dir", o->save_dir, "checkpoint root to write")->required();
    from_bnb->add_option("--world-size,--world_size", o->world_size,
                         "ranks of the run that resumes, for its global batch when training.global_batch_size is not set")
        ->capture_default_str();
    for (auto* sub : {to_ckpt, to_hf, from_dcp, to_dcp, to_bnb, from_bnb}) sub->add_flag("--overwrite", o->overwrite, kOverwriteHelp);
    commands.add(from_bnb, [o, name] {
      convert_bnb_to_ckpt(name, o->config_path, o->hf_dir, o->bnb_path, o->save_dir, std::max(1, o->world_size), o->overwrite);
    });
    commands.add(to_bnb, [o, name] { convert_ckpt_to_bnb(name, o->load_dir, o->save_dir, o->overwrite); });
    commands.add(to_ckpt, [o, name] { convert_hf_to_ckpt(name, o->config_path, o->hf_dir, o->save_dir, o->overwrite); });
    commands.add(from_dcp, [o, name] {
      convert_dcp_to_ckpt(name, o->config_path, o->load_dir, o->save_dir, o->drop, o->world_size,
                          o->layout == "hf" ? DcpLayout::hf : DcpLayout::training, o->overwrite);
    });
    commands.add(to_dcp, [o, name] {
      convert_ckpt_to_dcp(name, o->load_dir, o->save_dir, o->layout == "hf" ? DcpLayout::hf : DcpLayout::training,
                          o->overwrite);
    });
    commands.add(to_hf, [o, name] {
      convert_ckpt_to_hf(name, o->load_dir, o->save_dir, o->assets_dir, o->overwrite, o->ema);
    });
  }
}

}  // namespace mmtrain
