#include "convert/bnb_optimizer.h"

#include "convert/conversion_output.h"
#include "convert/convert.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "optim/adamw8bit.h"
#include "optim/lr_schedule.h"
#include "quant/dynamic_map.h"
#include "train/state.h"
#include "train/state_adamw8bit.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>

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
      const auto map = m ? quant::DynamicMap::unsigned_values : quant::DynamicMap::signed_values;
      const std::string codes = adamw8bit_codes_key(name, m), absmax = adamw8bit_absmax_key(name, m);
      // Codes and absmax of one moment, in the HF layout (a reordered param quantized again).
      auto hf_state = [&reader, &opened, name, codes, absmax, map, reorder, shape = param->shape] {
        quant::Blockwise8 state{reader.read_full(codes), reader.read_full(absmax)};
        if (!reorder) return state;
        const at::Tensor values = quant::dequantize_blockwise8(state.codes, state.absmax, AdamW8bit::kBlocksize, map);
        return quant::quantize_blockwise8(opened.adapter->to_hf_layout(name, values.view(shape)).contiguous(),
                                          AdamW8bit::kBlocksize, map);
      };
      const std::string index = m ? "2" : "1";
      add(hf + "state" + index, at::kByte, param->shape, [hf_state, shape = param->shape] { return hf_state().codes.view(shape); });
      add(hf + "absmax" + index, at::kFloat, {blocks}, [hf_state] { return hf_state().absmax; });
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

}  // namespace mmtrain
