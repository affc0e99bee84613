#include "tools/flops.h"

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/error.h"
#include "models/magihuman/flops.h"
#include "models/mistral3/model.h"

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

// "504x644" -> (504, 644)
std::pair<int64_t, int64_t> parse_image_size(const std::string& text) {
  const auto x = text.find_first_of("xX");
  size_t end_h = 0, end_w = 0;
  int64_t h = 0, w = 0;
  try {
    if (x != std::string::npos) {
      h = std::stoll(text.substr(0, x), &end_h);
      w = std::stoll(text.substr(x + 1), &end_w);
    }
  } catch (const std::exception&) {
    end_h = 0;
  }
  if (x == std::string::npos || end_h != x || end_w != text.size() - x - 1 || end_h == 0 || end_w == 0)
    fail("flops mistral3: --images expects HxW in pixels (e.g. 504x644), found '", text, "'");
  return {h, w};
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

void flops_mistral3(const FlopsOptions& o) {
  if (o.config_path.empty()) fail("flops mistral3: expected --config CFG");
  if (o.seqlens.empty()) fail("flops mistral3: expected at least one sequence length, found none");
  for (size_t i = 0; i < o.seqlens.size(); ++i)
    if (o.seqlens[i] <= 0)
      fail("flops mistral3: expected positive sequence lengths, found ", o.seqlens[i], " at position ", i);
  if (o.global_batch_size <= 0) fail("flops mistral3: --gbs must be positive, found ", o.global_batch_size);
  if (o.device_num <= 0) fail("flops mistral3: --device_num must be positive, found ", o.device_num);
  const auto cfg = config_load(o.config_path, o.overrides);
  if (cfg.model.model_id != "mistral3")
    fail("flops mistral3: config ", o.config_path, ": expected model.model_id 'mistral3', found '",
         cfg.model.model_id, "'");
  const auto c = mistral3::Mistral3Config::from_json(cfg.model.config);

  std::vector<std::pair<int64_t, int64_t>> images;
  int64_t patches = 0, merged = 0;
  std::ostringstream image_list;
  for (const auto& text : o.images) {
    const auto [h, w] = parse_image_size(text);
    if (h < c.patch_size || w < c.patch_size || h > c.image_size || w > c.image_size)
      fail("flops mistral3: image ", text, ": height and width must be in [patch_size ", c.patch_size,
           ", vision image_size ", c.image_size, "]");
    const int64_t gh = h / c.patch_size, gw = w / c.patch_size;
    const int64_t image_tokens = (gh / c.spatial_merge_size) * (gw / c.spatial_merge_size);
    patches += gh * gw;
    merged += image_tokens;
    image_list << (images.empty() ? "" : ", ") << h << "x" << w << " (" << gh * gw << " patches -> " << image_tokens
               << " [IMG])";
    images.emplace_back(h, w);
  }
  const auto f = mistral3::mistral3_flops_terms(c, o.seqlens, images);
  int64_t total_tokens = 0;
  for (int64_t s : o.seqlens) total_tokens += s;
  const double samples = static_cast<double>(o.seqlens.size());
  const double text = f.text_matmul + f.text_attention;
  const double vision = f.vision_multiplier * (f.vision_forward + f.projector_forward);
  const double flops_per_sample = f.total() / samples;
  const double flops_per_step = flops_per_sample * static_cast<double>(o.global_batch_size);
  const char* vision_role = c.freeze_vision ? "frozen: forward only, x1" : "trained: forward + backward, x3";

  std::printf("Mistral3 FLOPs (spec magistral.md §9: causal text attention, vision x1 when frozen; docs/flops.md)\n");
  std::printf("  source                 %s (model.config)\n", o.config_path.c_str());
  std::printf("  text model             %lld layers, hidden %lld, %lld q / %lld kv heads x %lld, vocab %lld\n",
              static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
              static_cast<long long>(c.num_heads), static_cast<long long>(c.num_kv_heads),
              static_cast<long long>(c.head_dim), static_cast<long long>(c.vocab_size));
  std::printf("  vision model           %lld layers, hidden %lld, patch %lld, merge %lld, %s\n",
              static_cast<long long>(c.vision_num_layers), static_cast<long long>(c.vision_hidden_size),
              static_cast<long long>(c.patch_size), static_cast<long long>(c.spatial_merge_size), vision_role);
  std::printf("  matmul params          text %s (layers + lm_head), vision %s, projector %s\n",
              with_commas(f.text_matmul_params).c_str(), with_commas(f.vision_matmul_params).c_str(),
              with_commas(f.projector_matmul_params).c_str());
  std::printf("  samples                %lld, seqlens [%s], %lld tokens\n", static_cast<long long>(o.seqlens.size()),
              join(o.seqlens).c_str(), static_cast<long long>(total_tokens));
  std::printf("  text term              %.4e FLOPs = %.2f GFLOP per token (matmuls %.2f + causal attention %.2f)\n",
              text, text / total_tokens / 1e9, f.text_matmul / total_tokens / 1e9,
              f.text_attention / total_tokens / 1e9);
  if (!images.empty()) {
    if (images.size() > 1) image_list << "; " << patches << " patches -> " << merged << " [IMG] in all";
    std::printf("  images                 %zu: %s\n", images.size(), image_list.str().c_str());
    std::printf("  vision term            %.4e FLOPs: tower forward %.4e + projector forward %.4e, x%g (%s)\n", vision,
                f.vision_forward, f.projector_forward, f.vision_multiplier, c.freeze_vision ? "frozen" : "trained");
  }
  std::printf("  model FLOPs            %.4e per sample, %.4e per step (gbs %lld)\n", flops_per_sample, flops_per_step,
              static_cast<long long>(o.global_batch_size));
  nlohmann::ordered_json j = {{"text_matmul_params", static_cast<int64_t>(std::llround(f.text_matmul_params))},
                              {"vision_matmul_params", static_cast<int64_t>(std::llround(f.vision_matmul_params))},
                              {"projector_matmul_params", static_cast<int64_t>(std::llround(f.projector_matmul_params))},
                              {"samples", static_cast<int64_t>(o.seqlens.size())},
                              {"tokens", total_tokens},
                              {"text_matmul_flops", f.text_matmul},
                              {"text_attention_flops", f.text_attention},
                              {"text_flops_per_token", text / total_tokens},
                              {"images", static_cast<int64_t>(images.size())},
                              {"patches", patches},
                              {"merged_tokens", merged},
                              {"vision_forward_flops", f.vision_forward},
                              {"projector_forward_flops", f.projector_forward},
                              {"vision_multiplier", f.vision_multiplier},
                              {"vision_flops", vision},
                              {"flops_per_sample", flops_per_sample},
                              {"flops_per_step", flops_per_step},
                              {"global_batch_size", o.global_batch_size},
                              {"device_num", o.device_num}};
  if (o.step_time > 0) {
    const double tflops_per_device = flops_per_step / o.step_time / static_cast<double>(o.device_num) / 1e12;
    std::printf("  throughput             %.3f TFLOP/s per device (%lld devices, step %.4f s)\n", tflops_per_device,
                static_cast<long long>(o.device_num), o.step_time);
    j["step_time"] = o.step_time;
    j["tflops_per_device"] = tflops_per_device;
    if (o.hardware_flops > 0) {
      const double mfu = tflops_per_device * 1e12 / o.hardware_flops;
      std::printf("  MFU                    %.2f %% of %.1f TFLOP/s\n", 100.0 * mfu, o.hardware_flops / 1e12);
      j["hardware_flops"] = o.hardware_flops;
      j["mfu"] = mfu;
    }
  }
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace mmtrain
