#include "convert/bnb_optimizer.h"

#include "config/config.h"
#include "config/registries.h"
#include "convert/conversion_output.h"
#include "convert/convert.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/safetensors.h"
#include "optim/adamw8bit.h"
#include "optim/lr_schedule.h"
#include "parallel/parallel_dims.h"
#include "quant/dynamic_map.h"
#include "train/build.h"
#include "train/hf_weights.h"
#include "train/state.h"
#include "train/state_adamw8bit.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>

namespace mmtrain {

void convert_ckpt_to_bnb(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                         bool overwrite) {
  ConversionOutput output(save_dir, overwrite, "ckpt-to-bnb");
  const auto opened = open_checkpoint_of(model_id, load_dir, "ckpt-to-bnb");
  const CheckpointReader& reader = *opened.reader;
  const auto& global = reader.global_state();
  if (global.value("model_only", false) || global.value("optimizer_state", std::string("adamw")) != "adamw8bit")
    fail("ckpt-to-bnb: ", reader.dir(), " holds no 8-bit AdamW state (it was not trained with training.optimizer ",
         "adamw8bit); `mmtrain convert ", model_id, " ckpt-to-dcp` writes AdamW's moments for torch.optim.AdamW");
  const auto& t = global.at("config").at("training");
  const int64_t iteration = reader.iteration();
  const auto schedule = LrSchedule::make(t.at("lr"), t.at("lr_min"), t.at("lr_warmup_ratio"), t.at("train_iters"),
                                         t.at("lr_decay_style"));

  std::vector<SafetensorsSource> tensors;
  nlohmann::json names = nlohmann::json::array();
  int64_t requantized = 0;
  auto add = [&](const std::string& key, at::ScalarType dtype, std::vector<int64_t> shape, std::function<at::Tensor()> fetch) {
    tensors.push_back({key, dtype, std::move(shape), std::move(fetch)});
  };
  for (auto& [name, param] : opened.model->named_parameters()) {
    if (!param->trainable || !param->requires_grad || !reader.contains(state_model_key(name))) continue;
    const std::string hf = "state." + opened.adapter->hf_key(name) + ".";
    const bool reorder = opened.adapter->layout_differs(name);
    names.push_back(opened.adapter->hf_key(name));
    if (!reader.contains(adamw8bit_codes_key(name, 0))) {  // below min_8bit_size: fp32 moments
      for (int m = 0; m < 2; ++m) {
        const std::string key = m ? state_exp_avg_sq_key(name) : state_exp_avg_key(name);
        add(hf + (m ? "state2" : "state1"), at::kFloat, param->shape, [&reader, &opened, key, name, reorder] {
          const at::Tensor moment = reader.read_full(key).to(at::kFloat);
          return reorder ? opened.adapter->to_hf_layout(name, moment).contiguous() : moment;
        });
      }
      continue;
    }
    requantized += reorder ? 1 : 0;
    const int64_t blocks = (reader.global_shape(adamw8bit_absmax_key(name, 0)))[0];
    for (int m = 0; m < 2; ++m) {
      const std::string codes = adamw8bit_codes_key(name, m), absmax = adamw8bit_absmax_key(name, m);
      const std::string index = m ? "2" : "1";
      if (!reorder) {
        add(hf + "state" + index, at::kByte, param->shape, [&reader, codes] { return reader.read_full(codes); });
        add(hf + "absmax" + index, at::kFloat, {blocks}, [&reader, absmax] { return reader.read_full(absmax); });
        continue;
      }
      // A reordered param's moment, quantized again in the HF rows once: its codes' fetch computes
      // it, its absmax's (written next) takes it and lets it go.
      auto hf_state = std::make_shared<std::optional<quant::Blockwise8>>();
      auto requantize = [&reader, &opened, name, codes, absmax, m, hf_state, shape = param->shape]() -> quant::Blockwise8& {
        if (!*hf_state) {
          const at::Tensor values = quant::dequantize_blockwise8(reader.read_full(codes), reader.read_full(absmax),
                                                                 AdamW8bit::kBlocksize, AdamW8bit::map_of(m));
          *hf_state = quant::quantize_blockwise8(opened.adapter->to_hf_layout(name, values.view(shape)).contiguous(),
                                                    AdamW8bit::kBlocksize, AdamW8bit::map_of(m));
        }
        return **hf_state;
      };
      add(hf + "state" + index, at::kByte, param->shape, [requantize, shape = param->shape] { return requantize().codes.view(shape); });
      add(hf + "absmax" + index, at::kFloat, {blocks}, [requantize, hf_state] {
        const at::Tensor out = requantize().absmax;
        hf_state->reset();
        return out;
      });
    }
  }
  add("qmap1", at::kFloat, {256}, [] { return quant::dynamic_map(quant::DynamicMap::signed_values); });
  add("qmap2", at::kFloat, {256}, [] { return quant::dynamic_map(quant::DynamicMap::unsigned_values); });
  const std::map<std::string, std::string> metadata = {
      {"format", "bitsandbytes.optim.AdamW8bit"},
      {"step", std::to_string(global.value("optimizer_step", iteration))},
      {"lr", nlohmann::json(schedule.at(std::max<int64_t>(0, iteration - 1))).dump()},
      {"betas", nlohmann::json::array({t.at("adam_beta1"), t.at("adam_beta2")}).dump()},
      {"eps", t.at("adam_eps").dump()},
      {"weight_decay", t.at("weight_decay").dump()},
      {"min_8bit_size", global.at("min_8bit_size").dump()},
      {"params", names.dump()}};
  const std::string path = (std::filesystem::path(output.staging()) / "optimizer.safetensors").string();
  safetensors_write_streamed(path, tensors, metadata);
  output.commit();
  std::printf("ckpt-to-bnb: %s -> %s/optimizer.safetensors (%zu params' AdamW8bit state, step %s%s)\n",
              reader.dir().c_str(), save_dir.c_str(), names.size(), metadata.at("step").c_str(),
              requantized ? (", " + std::to_string(requantized) + " reordered into the HF rows and quantized again").c_str() : "");
}

namespace {

// The file's metadata field `key` as JSON (what save_state and ckpt-to-bnb write).
nlohmann::json bnb_meta(const SafetensorsFile& file, const std::string& key) {
  const auto& meta = file.metadata();
  const auto found = meta.find(key);
  if (found == meta.end()) fail("bnb-to-ckpt: ", file.path(), ": its metadata has no '", key, "'");
  return key == "format" ? nlohmann::json(found->second) : json_parse_checked(found->second, file.path() + ": metadata " + key);
}

// The file's `key`, checked to be dtype [shape] before it is read.
at::Tensor bnb_tensor(const SafetensorsFile& file, const std::string& key, at::ScalarType dtype,
                      const std::vector<int64_t>& shape) {
  if (!file.contains(key)) fail("bnb-to-ckpt: ", file.path(), " has no '", key, "'");
  const auto& info = file.info(key);
  if (info.dtype != dtype || info.shape != shape)
    fail("bnb-to-ckpt: ", file.path(), ": '", key, "' must be ", dtype, " ", shape_str(shape), ", found ", info.dtype,
         " ", shape_str(info.shape));
  return file.read(key);
}

}  // namespace

void convert_bnb_to_ckpt(const std::string& model_id, const std::string& config_path, const std::string& hf_dir,
                         const std::string& bnb_path, const std::string& save_dir, int world_size, bool overwrite) {
  Config config = config_load(config_path);
  const TrainingConfig& t = config.training;
  const std::string where = "bnb-to-ckpt: " + config_path + ": ";
  if (config.model.model_id != model_id) fail(where, "configures model '", config.model.model_id, "', not '", model_id, "'");
  if (t.optimizer != "adamw8bit")
    fail(where, "training.optimizer is ", t.optimizer, "; the run that continues an AdamW8bit state sets adamw8bit");
  if (config.features.enable_lora) fail(where, "features.enable_lora: bnb-to-ckpt takes full fine-tuning states only");
  const SafetensorsFile file(bnb_path, SafetensorsFile::Symlinks::refuse);
  if (bnb_meta(file, "format") != "bitsandbytes.optim.AdamW8bit")
    fail("bnb-to-ckpt: ", bnb_path, " is not an AdamW8bit state (metadata format ", bnb_meta(file, "format").dump(), ")");
  const nlohmann::json step = bnb_meta(file, "step"), betas = bnb_meta(file, "betas"), eps = bnb_meta(file, "eps"),
                       decay = bnb_meta(file, "weight_decay"), min_size = bnb_meta(file, "min_8bit_size");
  if (!step.is_number_integer() || step.get<int64_t>() < 0 || !min_size.is_number_integer() || !betas.is_array() ||
      betas.size() != 2 || !betas[0].is_number() || !betas[1].is_number() || !eps.is_number() || !decay.is_number())
    fail("bnb-to-ckpt: ", bnb_path, ": expected integer step and min_8bit_size, two betas, numbers eps and weight_decay");
  auto same = [&](const char* what, double file_value, double config_value, const char* key) {
    if (file_value != config_value)
      fail("bnb-to-ckpt: ", bnb_path, " has ", what, " ", file_value, " and ", config_path, " sets training.", key, " ",
           config_value, " (the run would step with different hyperparameters)");
  };
  same("betas[0]", betas[0].get<double>(), t.adam_beta1, "adam_beta1");
  same("betas[1]", betas[1].get<double>(), t.adam_beta2, "adam_beta2");
  same("eps", eps.get<double>(), t.adam_eps, "adam_eps");
  same("weight_decay", decay.get<double>(), t.weight_decay, "weight_decay");
  same("min_8bit_size", static_cast<double>(min_size.get<int64_t>()), static_cast<double>(t.min_8bit_size), "min_8bit_size");

  ConversionOutput output(save_dir, overwrite, "bnb-to-ckpt");
  auto model = build_model(config);
  const auto adapter = make_hf_adapter(config_model_spec(config), config.model.config);
  auto comm = std::make_shared<Comm>(nullptr, 0, 1);
  const FsdpConfig plan;  // one unit, fp32: the layout every world size reshards from
  Fsdp fsdp(*model, comm, plan);
  const int64_t conversions = load_hf_weights(*model, *adapter, fsdp, WeightSource(hf_dir));
  auto optimizer = make_fsdp_optimizer(fsdp, t);
  auto& adamw8bit = dynamic_cast<AdamW8bit&>(*optimizer);

  std::set<std::string> placed;
  for (const std::string& name : bnb_meta(file, "params").get<std::vector<std::string>>()) placed.insert(name);
  int64_t requantized = 0;
  for (const FsdpParam& param : fsdp.units().at(0)->params) {
    if (param.frozen) continue;
    const std::string hf = adapter->hf_key(param.name), prefix = "state." + hf + ".";
    if (!placed.erase(hf)) fail("bnb-to-ckpt: ", bnb_path, " holds no state for '", hf, "' (params in its metadata)");
    const auto& shape = param.param->shape;
    const bool reorder = adapter->layout_differs(param.name);
    // An HF-layout tensor of the param in the training rows.
    auto training_rows = [&](const at::Tensor& hf_values) {
      if (!reorder) return hf_values;
      return adapter->load_rows(param.name, 0, shape.at(0), [&](const std::string&, int64_t b, int64_t e) {
        return hf_values.narrow(0, b, e - b);
      });
    };
    if (!adamw8bit.is_8bit(0, param.name)) {
      for (int m = 0; m < 2; ++m)
        adamw8bit.moment(0, param.name, m)
            .copy_(training_rows(bnb_tensor(file, prefix + (m ? "state2" : "state1"), at::kFloat, shape)).reshape(-1));
      continue;
    }
    requantized += reorder ? 1 : 0;
    const int64_t blocks = AdamW8bit::blocks_of(param.layout.dim0 * param.layout.row_numel);
    for (int m = 0; m < 2; ++m) {
      const std::string index = m ? "2" : "1";
      const auto map = AdamW8bit::map_of(m);
      quant::Blockwise8 state{bnb_tensor(file, prefix + "state" + index, at::kByte, shape),
                              bnb_tensor(file, prefix + "absmax" + index, at::kFloat, {blocks})};
      adamw8bit_check_absmax(state.absmax, 0, "bnb-to-ckpt: " + bnb_path + ": '" + prefix + "absmax" + index + "'");
      if (reorder) {
        const at::Tensor values = quant::dequantize_blockwise8(state.codes, state.absmax, AdamW8bit::kBlocksize, map);
        state = quant::quantize_blockwise8(training_rows(values.view(shape)).contiguous(), AdamW8bit::kBlocksize, map);
      }
      adamw8bit.codes(0, param.name, m).copy_(state.codes.reshape(-1));
      adamw8bit.absmax(0, param.name, m).copy_(state.absmax);
    }
  }
  if (!placed.empty())
    fail("bnb-to-ckpt: ", bnb_path, " holds the state of '", *placed.begin(), "', which model '", model_id,
         "' does not train (", placed.size(), " such)");
  adamw8bit.set_step_count(step.get<int64_t>());

  StateInfo info;
  info.iteration = step.get<int64_t>();
  info.global_batch_size = config_global_batch(config, parallel_dims(config.parallel, world_size, where));
  info.model_id = model_id;
  info.config = config_to_json(config);
  info.extra = {{"source", bnb_path}};
  info.plan = state_plan_entry(plan);
  info.plan["converted_from"] = "bnb";
  const auto dir = state_save(output.staging(), *comm, *model, fsdp, optimizer.get(), info);
  output.commit();
  std::printf("bnb-to-ckpt: %s + %s -> %s (iteration %lld, %lld weights with a converted layout%s)\n", hf_dir.c_str(),
              bnb_path.c_str(), (std::filesystem::path(save_dir) / std::filesystem::path(dir).filename()).c_str(),
              static_cast<long long>(info.iteration), static_cast<long long>(conversions),
              requantized ? (", " + std::to_string(requantized) + " 8-bit states reordered and quantized again").c_str() : "");
}

}  // namespace mmtrain
