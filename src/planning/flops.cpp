#include "planning/flops.h"

#include "cli/command.h"
#include "config/config.h"
#include "core/error.h"
#include "core/text.h"
#include "models/model_spec.h"

#include <CLI/CLI.hpp>

#include <cstdio>

namespace mmtrain {

std::pair<int64_t, int64_t> parse_image_size(const std::string& tool, const std::string& text) {
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
    fail(tool, ": --images expects HxW in pixels (e.g. 504x644), found '", text, "'");
  return {h, w};
}

void flops_report(const std::string& model_id, const FlopsOptions& o) {
  const std::string tool = "flops " + model_id;
  const auto& spec = model_spec(model_id, tool);
  if (o.config_path.empty() == o.ckpt_dir.empty())
    fail(tool, ": expected exactly one of --config CFG or --ckpt DIR, found ", o.config_path.empty() ? "neither" : "both");
  if (o.seqlens.empty()) fail(tool, ": expected at least one sequence length, found none");
  for (size_t i = 0; i < o.seqlens.size(); ++i)
    if (o.seqlens[i] <= 0) fail(tool, ": expected positive sequence lengths, found ", o.seqlens[i], " at position ", i);
  if (o.global_batch_size <= 0) fail(tool, ": --gbs must be positive, found ", o.global_batch_size);
  if (o.device_num <= 0) fail(tool, ": --device_num must be positive, found ", o.device_num);

  nlohmann::json model_config;
  std::string source;
  if (!o.config_path.empty()) {
    const auto cfg = config_load(o.config_path, o.overrides);
    if (cfg.model.model_id != model_id)
      fail(tool, ": config ", o.config_path, ": expected model.model_id '", model_id, "', found '", cfg.model.model_id,
           "'");
    model_config = cfg.model.config;
    source = o.config_path + " (model.config)";
  } else {
    if (!spec.config_from_checkpoint) fail(tool, ": --ckpt is not supported for this model; give --config");
    model_config = spec.config_from_checkpoint(o.ckpt_dir);
    source = o.ckpt_dir + " (config read off the checkpoint)";
  }
  FlopsQuery query;
  query.seqlens = o.seqlens;
  for (const auto& text : o.images) query.images.push_back(parse_image_size(tool, text));
  if (!o.attention_coefficient.empty()) query.attention_coefficient = o.attention_coefficient.front();
  const auto r = spec.flops(model_config, query);

  const double flops_per_step = r.flops_per_sample * static_cast<double>(o.global_batch_size);
  std::printf("%s\n", r.title.c_str());
  std::printf("  source                 %s\n", source.c_str());
  for (const auto& line : r.lines) std::printf("  %s\n", line.c_str());
  std::printf("  model FLOPs            %.4e per sample, %.4e per step (gbs %lld)\n", r.flops_per_sample, flops_per_step,
              static_cast<long long>(o.global_batch_size));
  nlohmann::ordered_json j = r.fields;
  j["flops_per_sample"] = r.flops_per_sample;
  j["flops_per_step"] = flops_per_step;
  j["global_batch_size"] = o.global_batch_size;
  j["device_num"] = o.device_num;
  if (o.step_time > 0) {
    const auto rate = throughput(flops_per_step, static_cast<double>(o.device_num), o.step_time, o.hardware_flops);
    const double tflops_per_device = rate.tflops_per_device;
    std::printf("  throughput             %.3f TFLOP/s per device (%lld devices, step %.4f s)\n", tflops_per_device,
                static_cast<long long>(o.device_num), o.step_time);
    j["step_time"] = o.step_time;
    j["tflops_per_device"] = tflops_per_device;
    if (o.hardware_flops > 0) {
      const double mfu = rate.mfu;
      std::printf("  MFU                    %.2f %% of %.1f TFLOP/s\n", 100.0 * mfu, o.hardware_flops / 1e12);
      j["hardware_flops"] = o.hardware_flops;
      j["mfu"] = mfu;
    }
  }
  std::printf("%s\n", j.dump().c_str());
}

void add_flops_commands(CLI::App& app, Commands& commands) {
  auto* flops = app.add_subcommand("flops", "model FLOPs, TFLOP/s per device and MFU (docs/flops.md)");
  flops->require_subcommand(1);
  for (const auto& name : model_spec_registry().names()) {
    const auto& spec = model_spec(name);
    if (!spec.flops) continue;
    auto o = std::make_shared<FlopsOptions>();
    auto* cmd = flops->add_subcommand(name, spec.title + " model FLOPs");
    auto* config = cmd->add_option("--config", o->config_path, "mmtrain YAML (model.config)");
    auto* ckpt = cmd->add_option("--ckpt", o->ckpt_dir, "HF checkpoint dir (config read off it, no tensor data)");
    config->excludes(ckpt);
    cmd->add_option("--set", o->overrides, "override a key of --config (repeatable)");
    cmd->add_option("--seqlens", o->seqlens, "per-sample sequence lengths (space- or comma-separated)")
        ->required()
        ->delimiter(',');
    cmd->add_option("--images", o->images, "HxW in pixels of every image of those samples (image-text models)")
        ->delimiter(',');
    cmd->add_option("--gbs", o->global_batch_size, "global batch size (samples per step)")->capture_default_str();
    cmd->add_option("--device_num,--device-num", o->device_num, "devices")->capture_default_str();
    cmd->add_option("--step_time,--step-time", o->step_time, "seconds per step (0: no throughput)")->capture_default_str();
    cmd->add_option("--hardware_flops,--hardware-flops", o->hardware_flops, "peak FLOP/s per device (0: no MFU)")
        ->capture_default_str();
    cmd->add_option("--attention-coefficient,--attention_coefficient", o->attention_coefficient,
                    "attention FLOPs per s^2*head_dim*heads*layer, for a model whose convention takes one (its default otherwise)")
        ->expected(1);
    commands.add(cmd, [o, name] { flops_report(name, *o); });
  }
}

}  // namespace mmtrain
