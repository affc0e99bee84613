#include "tools/flops.h"

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/error.h"
#include "models/magihuman/flops.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <sstream>

namespace mmtrain {
namespace {

using magihuman::MagiHumanConfig;

// 10933616640 -> "10,933,616,640"
std::string with_commas(double value) {
  std::string digits = std::to_string(std::llround(value));
  for (int at = static_cast<int>(digits.size()) - 3; at > 0; at -= 3) digits.insert(at, ",");
  return digits;
}

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  for (size_t i = 0; i < values.size(); ++i) out << (i ? "," : "") << values[i];
  return out.str();
}

}  // namespace

void flops_magihuman(const FlopsOptions& o) {
  if (o.config_path.empty() == o.ckpt_dir.empty())
    fail("flops magihuman: expected exactly one of --config CFG or --ckpt DIR, found ",
         o.config_path.empty() ? "neither" : "both");
  if (o.attention_coefficient < 0)
    fail("flops magihuman: --attention-coefficient must be >= 0, found ", o.attention_coefficient);

  MagiHumanConfig config;
  double active = 0;
  std::string source;
  if (!o.config_path.empty()) {
    const auto cfg = config_load(o.config_path, o.overrides);
    if (cfg.model.model_id != "magihuman")
      fail("flops magihuman: config ", o.config_path, ": expected model.model_id 'magihuman', found '",
           cfg.model.model_id, "'");
    config = MagiHumanConfig::from_json(cfg.model.config);
    active = magihuman::magihuman_active_linear_params(config);
    source = o.config_path + " (model.config)";
  } else {
    // Shapes only: SafetensorsIndex reads and validates the headers, never the tensor data.
    SafetensorsIndex index(o.ckpt_dir);
    std::vector<magihuman::NamedShape> tensors;
    for (const auto& name : index.names()) tensors.emplace_back(name, index.info(name).shape);
    config = magihuman::magihuman_config_from_tensors(tensors);
    active = magihuman::magihuman_active_linear_params(tensors, config.mm_layers);
    source = o.ckpt_dir + " (" + std::to_string(tensors.size()) + " tensors in " +
             std::to_string(index.file_names().size()) + " file(s))";
  }

  const auto t = magihuman::magihuman_throughput(active, config, o.seqlens, o.global_batch_size, o.device_num,
                                                 o.step_time, o.hardware_flops, o.attention_coefficient);
  int64_t total_tokens = 0;
  for (int64_t s : o.seqlens) total_tokens += s;

  std::printf("MagiHuman FLOPs (MindSpeed-MM flops_magihuman.py convention; docs/flops.md)\n");
  std::printf("  source                 %s\n", source.c_str());
  std::printf("  model                  %lld layers, hidden %lld, %lld q / %lld kv heads x %lld, mm_layers [%s]\n",
              static_cast<long long>(config.num_layers), static_cast<long long>(config.hidden_size),
              static_cast<long long>(config.num_heads_q()), static_cast<long long>(config.num_query_groups),
              static_cast<long long>(config.head_dim), join(config.mm_layers).c_str());
  std::printf("  active linear params   %s (%.3fB; 2-D tensors, mm_layers / %d)\n", with_commas(active).c_str(),
              active / 1e9, magihuman::kNumModalities);
  std::printf("  samples                %lld, seqlens [%s], %lld tokens\n", static_cast<long long>(t.samples),
              join(o.seqlens).c_str(), static_cast<long long>(total_tokens));
  std::printf("  linear term            %.4e FLOPs per sample (6 * N * tokens)\n", t.linear_flops_per_sample);
  std::printf("  attention term         %.4e FLOPs per sample (%g * s^2 * head_dim * heads * layers; full "
              "bidirectional attention costs ~2x the seed's 7)\n",
              t.attention_flops_per_sample, t.attention_coefficient);
  std::printf("  model FLOPs            %.4e per sample, %.4e per step (gbs %lld)\n", t.flops_per_sample,
              t.flops_per_step, static_cast<long long>(o.global_batch_size));
  nlohmann::ordered_json j = {{"active_linear_params", static_cast<int64_t>(std::llround(active))},
                              {"attention_coefficient", t.attention_coefficient},
                              {"samples", t.samples},
                              {"linear_flops_per_sample", t.linear_flops_per_sample},
                              {"attention_flops_per_sample", t.attention_flops_per_sample},
                              {"flops_per_sample", t.flops_per_sample},
                              {"flops_per_step", t.flops_per_step},
                              {"global_batch_size", o.global_batch_size},
                              {"device_num", o.device_num}};
  if (o.step_time > 0) {
    std::printf("  throughput             %.3f TFLOP/s per device (%lld devices, step %.4f s)\n", t.tflops_per_device,
                static_cast<long long>(o.device_num), o.step_time);
    j["step_time"] = o.step_time;
    j["tflops_per_device"] = t.tflops_per_device;
  }
  if (o.step_time > 0 && o.hardware_flops > 0) {
    std::printf("  MFU                    %.2f %% of %.1f TFLOP/s\n", 100.0 * t.mfu, o.hardware_flops / 1e12);
    j["hardware_flops"] = o.hardware_flops;
    j["mfu"] = t.mfu;
  }
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace mmtrain
