#include "tools/convert.h"

#include "checkpoint/atomic_file.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "models/magihuman/config.h"
#include "train/build.h"
#include "train/weights.h"

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

nlohmann::json read_hf_config(const fs::path& path) {
  const std::string text = file_read_text(path.string());
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("convert: ", path.string(), " is not valid JSON (", e.what(), ")");
  }
}

std::shared_ptr<Model> model_from(const std::string& model_id, const nlohmann::json& model_config) {
  return model_registry().get(model_id, "convert")(model_config);
}

}  // namespace

void convert_hf_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& hf_dir,
                        const std::string& save_dir) {
  nlohmann::json model_config = nlohmann::json::object();
  WeightSource source(hf_dir);
  if (config_path.empty() && model_id == "magihuman") {
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& name : source.names()) shapes[name] = source.info(name).shape;
    model_config = magihuman::MagiHumanConfig::infer_from_shapes(shapes).to_json();
  } else if (!config_path.empty()) {
    auto config = config_load(config_path);
    if (config.model.model_id != model_id)
      fail("convert ", model_id, ": ", config_path, " configures model '", config.model.model_id, "'");
    model_config = config.model.config;
  } else if (fs::exists(fs::path(hf_dir) / "config.json")) {  // an HF model directory describes itself
    model_config = read_hf_config(fs::path(hf_dir) / "config.json");
  } else {
    fail("convert ", model_id, " hf-to-ckpt: ", hf_dir, " has no config.json; give --config with the model's model.config");
  }
  auto model = model_from(model_id, model_config);
  auto comm = std::make_shared<Comm>(nullptr, 0, 1);
  Fsdp fsdp(*model, comm, FsdpOptions{});
  const int64_t conversions = load_hf_weights(*model, fsdp, source);
  nlohmann::json global = {{"iteration", 0}, {"model_id", model_id}, {"model_only", true},
                           {"config", {{"model", {{"model_id", model_id}, {"config", model_config}}}}},
                           {"source", hf_dir}};
  auto dir = checkpoint_save(save_dir, 0, *comm, model_sharded_tensors(*model, fsdp, 0), global,
                             nlohmann::json::object(), {{"converted_from", "hf"}});
  std::printf("hf-to-ckpt: %s -> %s (%lld tensors with a converted layout)\n", hf_dir.c_str(), dir.c_str(),
              static_cast<long long>(conversions));
}

void convert_ckpt_to_hf(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                        const std::string& model_assets_dir) {
  CheckpointReader reader(load_dir);
  const auto& global = reader.global_state();
  if (global.value("model_id", "") != model_id)
    fail("ckpt-to-hf: ", reader.dir(), " holds model '", global.value("model_id", ""), "', not '", model_id, "'");
  auto model = model_from(model_id, global.at("config").at("model").at("config"));
  SafetensorsIndex reference(model_assets_dir);

  // HF key -> parameter name, under every naming scheme the model loads (e.g. mistral3's legacy
  // language_model.model.* keys): the output keeps the reference's own names.
  std::map<std::string, std::string> param_of_key;
  const auto params = model->named_parameters();
  for (auto& [name, param] : params) {
    param_of_key[model->hf_key(name)] = name;
    for (const auto& alias : model->hf_key_aliases(name)) param_of_key[alias] = name;
  }
  std::set<std::string> written;
  for (const auto& key : reference.names()) {
    if (!param_of_key.count(key)) fail("ckpt-to-hf: reference ", model_assets_dir, " has key '", key, "' the model lacks");
    if (!written.insert(param_of_key.at(key)).second)
      fail("ckpt-to-hf: reference ", model_assets_dir, " names parameter '", param_of_key.at(key), "' twice (key '", key, "')");
  }
  if (written.size() != params.size())
    fail("ckpt-to-hf: reference ", model_assets_dir, " has ", reference.names().size(), " tensors, the model ", params.size());

  fs::create_directories(save_dir);
  int64_t conversions = 0;
  for (const auto& file_name : reference.file_names()) {
    SafetensorsFile ref_file((fs::path(model_assets_dir) / file_name).string());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& key : ref_file.names()) {
      const auto& name = param_of_key.at(key);
      auto full = reader.read_full("model." + name);
      if (model->hf_layout_differs(name)) ++conversions;
      tensors.emplace_back(key, model->to_hf_layout(name, full).to(ref_file.info(key).dtype).contiguous());
    }
    safetensors_write((fs::path(save_dir) / file_name).string(), tensors, ref_file.metadata());
    std::printf("ckpt-to-hf: wrote %s (%zu tensors)\n", file_name.c_str(), tensors.size());
  }
  if (conversions != model->expected_layout_conversions())
    fail("ckpt-to-hf: restored the layout of ", conversions, " tensors, the config expects ",
         model->expected_layout_conversions());
  // Everything else in the reference (index, config.json, ...) is copied as it is: the index
  // maps the same keys to the same file names.
  for (const auto& entry : fs::directory_iterator(model_assets_dir)) {
    if (!entry.is_regular_file() || entry.path().extension() == ".safetensors") continue;
    fs::copy_file(entry.path(), fs::path(save_dir) / entry.path().filename(), fs::copy_options::overwrite_existing);
  }
  std::printf("ckpt-to-hf: %s -> %s (%lld tensors with a restored layout)\n", reader.dir().c_str(), save_dir.c_str(),
              static_cast<long long>(conversions));
}

}  // namespace mmtrain
