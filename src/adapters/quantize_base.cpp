#include "adapters/quantize_base.h"

#include "convert/base_files.h"
#include "convert/conversion_output.h"
#include "core/error.h"
#include "core/module_pattern.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "models/model_spec.h"
#include "train/hf_weights.h"

#include <cstdio>
#include <filesystem>
#include <set>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;


// The keys (as source names them) of the weights quantize-base stores quantized: every 2-D weight of
// a Linear the model can adapt.
std::set<std::string> quantizable_keys(const ModelSpec& spec, const WeightSource& source, const std::string& hf_dir) {
  if (!spec.config_from_checkpoint) fail("quantize-base: model '", spec.name, "' cannot read its config off ", hf_dir);
  const auto model_config = spec.config_from_checkpoint(hf_dir);
  auto model = spec.build(model_config);
  const auto adapter = make_hf_adapter(spec, model_config);
  std::set<std::string> keys;
  for (auto& [name, param] : model->named_parameters()) {
    const std::string suffix = ".weight";
    if (param->shape.size() != 2 || name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string module = name.substr(0, name.size() - suffix.size());
    bool adaptable = false;
    for (const auto& pattern : spec.lora_supported_targets) adaptable = adaptable || module_pattern_matches(pattern, module);
    if (!adaptable) continue;
    const std::string key = source_key_of(source, *adapter, name);
    if (key.empty()) fail("quantize-base: ", hf_dir, " lacks '", adapter->hf_key(name), "', a weight of the model");
    keys.insert(key);
  }
  if (keys.empty()) fail("quantize-base: model '", spec.name, "' has no Linear it adapts with LoRA: nothing to quantize");
  return keys;
}

// config.json with the quantization_config of the format, so that transformers loads the directory
// as a quantized model instead of reading codes as weights: for nf4 and int8 the one transformers
// writes for a bitsandbytes model (its default skipped modules: the output head, which
// quantize-base leaves in its dtype too); fp8_e4m3 rows (musubi-tuner's fp8_scaled) have no
// transformers loader, and a quant_method it does not know makes it refuse the directory by name.
std::string quantized_config_json(const std::string& text, const std::string& path, quant::BaseQuant kind,
                                  at::ScalarType compute_dtype) {
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("quantize-base: ", path, " is not JSON (", e.what(), ")");
  }
  if (!config.is_object()) fail("quantize-base: ", path, " is not a JSON object");
  if (kind == quant::BaseQuant::fp8_e4m3) {
    config["quantization_config"] = {{"quant_method", "mmtrain_fp8_e4m3_rowwise"},
                                     {"format", "fp8_scaled: <module>.weight float8_e4m3fn, <module>.scale_weight fp32 [out]"}};
    return config.dump(2) + "\n";
  }
  const bool nf4 = kind == quant::BaseQuant::nf4;
  const char* dtype = !nf4 || compute_dtype == at::kFloat ? "float32" : compute_dtype == at::kHalf ? "float16" : "bfloat16";
  config["quantization_config"] = {{"_load_in_4bit", nf4},
                                   {"_load_in_8bit", !nf4},
                                   {"bnb_4bit_compute_dtype", dtype},
                                   {"bnb_4bit_quant_storage", "uint8"},
                                   {"bnb_4bit_quant_type", nf4 ? "nf4" : "fp4"},
                                   {"bnb_4bit_use_double_quant", nf4},
                                   {"llm_int8_enable_fp32_cpu_offload", false},
                                   {"llm_int8_has_fp16_weight", false},
                                   {"llm_int8_skip_modules", nullptr},
                                   {"llm_int8_threshold", 6.0},
                                   {"load_in_4bit", nf4},
                                   {"load_in_8bit", !nf4},
                                   {"quant_method", "bitsandbytes"}};
  return config.dump(2) + "\n";
}

// Writes each of source's files under out_dir with the tensors `convert` gives for it, then the
// index (when sharded) and every other file of load_dir (config.json through edit_config).
void rewrite_directory(const WeightSource& source, const std::string& load_dir, const std::string& out_dir,
                       const std::function<std::vector<std::pair<std::string, at::Tensor>>(const std::string&)>& convert,
                       const std::function<std::string(const std::string&)>& edit_config, const char* command) {
  SafetensorsIndex index(load_dir);
  std::vector<std::pair<std::string, std::string>> weight_map;
  int64_t total = 0;
  std::set<std::string> done;
  for (const auto& file_name : index.file_names()) {
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : source.names()) {
      if (index.file_name(name) != file_name) continue;
      for (auto& entry : convert(name)) {
        total += entry.second.numel() * static_cast<int64_t>(entry.second.element_size());
        weight_map.emplace_back(entry.first, file_name);
        tensors.push_back(std::move(entry));
      }
      done.insert(name);
    }
    safetensors_write((fs::path(out_dir) / file_name).string(), tensors);
    std::printf("%s: wrote %s (%zu tensors)\n", command, file_name.c_str(), tensors.size());
    std::fflush(stdout);
  }
  if (index.sharded()) {
    std::sort(weight_map.begin(), weight_map.end());
    safetensors_index_write((fs::path(out_dir) / "model.safetensors.index.json").string(), {{"total_size", total}},
                            weight_map);
  }
  copy_base_files(load_dir, out_dir, command, {.edit_config = edit_config});
}

}  // namespace

std::string config_without_quantization(const std::string& text, const std::string& command) {
  nlohmann::ordered_json config;
  try {
    config = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(command, ": config.json is not JSON (", e.what(), ")");
  }
  if (!config.is_object()) fail(command, ": config.json is not a JSON object");
  if (!config.contains("quantization_config")) return text;  // a plain model's: as it is
  config.erase("quantization_config");
  return config.dump(2) + "\n";
}

void convert_quantize_base(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                           quant::BaseQuant kind, bool overwrite) {
  if (kind == quant::BaseQuant::none) fail("quantize-base: --dtype must be nf4, int8 or fp8_e4m3");
  const auto& spec = model_spec(model_id, "convert");
  ConversionOutput output(save_dir, overwrite, "quantize-base");
  const WeightSource source(load_dir);
  const std::set<std::string> keys = quantizable_keys(spec, source, load_dir);
  at::ScalarType compute_dtype = at::kBFloat16;
  int64_t quantized = 0, bytes_in = 0, bytes_out = 0;
  auto convert = [&](const std::string& name) -> std::vector<std::pair<std::string, at::Tensor>> {
    if (source.quantization(name) != quant::BaseQuant::none)
      fail("quantize-base: ", load_dir, " stores '", name, "' quantized already (", quant::base_quant_name(source.quantization(name)),
           "); dequantize-base it first");
    const at::Tensor full = source.read_full(name);
    if (!keys.count(name)) return {{name, full}};
    compute_dtype = full.scalar_type();
    const quant::QuantizedWeight q = quant::quantize_weight(full, kind);
    ++quantized;
    bytes_in += full.numel() * static_cast<int64_t>(full.element_size());
    bytes_out += quant::stored_bytes(q);
    return quant::hf_tensors(name, q);
  };
  auto edit_config = [&](const std::string& text) {
    return quantized_config_json(text, load_dir + "/config.json", kind, compute_dtype);
  };
  rewrite_directory(source, load_dir, output.staging(), convert, edit_config, "quantize-base");
  output.commit();
  std::printf("quantize-base: %s -> %s: %lld weights in %s, %s bytes -> %s (%.3fx)\n", load_dir.c_str(), save_dir.c_str(),
              static_cast<long long>(quantized), quant::base_quant_name(kind), with_commas(bytes_in).c_str(),
              with_commas(bytes_out).c_str(), bytes_in > 0 ? static_cast<double>(bytes_out) / bytes_in : 0.0);
}

void convert_dequantize_base(const std::string& model_id, const std::string& load_dir, const std::string& save_dir,
                             at::ScalarType dtype_8bit, bool overwrite) {
  model_spec(model_id, "convert");
  ConversionOutput output(save_dir, overwrite, "dequantize-base");
  const WeightSource source(load_dir);
  int64_t dequantized = 0;
  auto convert = [&](const std::string& name) -> std::vector<std::pair<std::string, at::Tensor>> {
    const auto kind = source.quantization(name);
    if (kind == quant::BaseQuant::none) return {{name, source.read_full(name)}};
    const quant::QuantizedWeight q = source.read_quantized(name, dtype_8bit);  // its codes checked against it
    ++dequantized;
    return {{name, quant::dequantize_weight(q, q.dtype).contiguous()}};
  };
  auto edit_config = [](const std::string& text) { return config_without_quantization(text, "dequantize-base"); };
  rewrite_directory(source, load_dir, output.staging(), convert, edit_config, "dequantize-base");
  output.commit();
  std::printf("dequantize-base: %s -> %s: %lld weights dequantized\n", load_dir.c_str(), save_dir.c_str(),
              static_cast<long long>(dequantized));
}

}  // namespace mmtrain
