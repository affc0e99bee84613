// `mmtrain sample magihuman CONFIG --load DIR --prompts FILE --out DIR`: MagiHuman clips from prompts,
// with upstream's base sampler (sample/magihuman_sampler.h) running in the C++ model, FSDP-sharded
// over the ranks, the prompts split over the data-parallel ranks. Prompt text is embedded by the
// media room's T5Gemma (python/mmtrain_media/embed.py) before the model is built; the latents are
// decoded to mp4 by its VAEs (decode.py) when --vae and --audio-vae are given. docs/sampling.md.
#include "config/config.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/scratch_dir.h"
#include "core/subprocess.h"
#include "core/text.h"
#include "dist/device_mesh.h"
#include "dist/runtime.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "models/magihuman/config.h"
#include "offload/offload_tiers.h"
#include "sample/magihuman_sampler.h"
#include "core/cli_command.h"
#include "media/media_room.h"
#include "tools/plots.h"
#include "tools/tool_model.h"
#include "train/build.h"
#include "train/run.h"

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

namespace mmtrain {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxPrompts = 10000;
constexpr int64_t kMaxTextTokens = 640;  // upstream's t5_gemma_target_length
constexpr double kMaxSeconds = 600;

struct SampleOptions {
  std::string config_path, load, prompts, out, text_encoder, negative_conditions, vae, audio_vae, text_device;
  std::string resolution = "256x480";
  double seconds = 5.0, shift = 5.0, guidance_video = 5.0, guidance_audio = 5.0;
  int64_t steps = 32;
  uint64_t seed = 0;
  std::vector<std::string> overrides;
};

// One line of the prompts file: {"prompt": TEXT, "seed": N} or {"conditions": FILE, "seed": N}.
struct Prompt {
  std::string text;        // embedded with --text-encoder
  std::string conditions;  // or a precomputed embedding, relative to the prompts file
  uint64_t seed = 0;
};

std::vector<Prompt> read_prompts(const std::string& path, uint64_t default_seed) {
  const std::string text = read_user_file(path, "--prompts", int64_t{16} << 20);
  const fs::path base = fs::weakly_canonical(fs::absolute(path)).parent_path();
  std::vector<Prompt> prompts;
  std::istringstream lines(text);
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (trim(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(number);
    const nlohmann::json j = json_parse_checked(line, where);
    if (!j.is_object()) fail(where, ": expected an object {\"prompt\": TEXT, \"seed\": N}");
    for (const auto& [key, _] : j.items())
      if (key != "prompt" && key != "conditions" && key != "seed")
        fail(where, ": unknown key '", printable(key), "' (prompt, conditions, seed)");
    Prompt p;
    p.seed = default_seed + prompts.size();
    if (j.contains("seed")) {
      if (!j["seed"].is_number_unsigned()) fail(where, ": 'seed' must be an integer >= 0");
      p.seed = j["seed"].get<uint64_t>();
    }
    if (j.contains("prompt") == j.contains("conditions")) fail(where, ": give exactly one of 'prompt' and 'conditions'");
    if (j.contains("prompt")) {
      p.text = json_string(j, "prompt", where);
      if (trim(p.text).empty()) fail(where, ": the prompt is empty");
    } else {
      const std::string relative = json_string(j, "conditions", where);
      const fs::path joined = base / relative;
      const fs::path resolved = fs::weakly_canonical(joined);
      const auto [end, _] = std::mismatch(base.begin(), base.end(), resolved.begin(), resolved.end());
      if (relative.empty() || fs::path(relative).is_absolute() || end != base.end())
        fail(where, ": 'conditions' ", printable(relative), " must be a file inside ", base.string());
      p.conditions = joined.string();
    }
    prompts.push_back(std::move(p));
    if (static_cast<int64_t>(prompts.size()) > kMaxPrompts) fail(path, ": more than ", kMaxPrompts, " prompts");
  }
  if (prompts.empty()) fail(path, ": no prompts (one JSON object a line)");
  return prompts;
}

// A text embedding [Nt, Ct] from a safetensors file ("prompt_embeds" or "text_embed"), checked.
at::Tensor read_embedding(const std::string& path, int64_t text_channels) {
  const SafetensorsFile file(path, SafetensorsFile::Symlinks::refuse);
  std::string key;
  for (const char* name : {"prompt_embeds", "text_embed"})
    if (file.contains(name)) key = name;
  if (key.empty()) fail(path, ": no 'prompt_embeds' (or 'text_embed') tensor");
  at::Tensor t = file.read(key);
  if (t.dim() == 3 && t.size(0) == 1) t = t.squeeze(0);
  if (t.dim() != 2 || t.size(1) != text_channels || t.size(0) < 1 || t.size(0) > kMaxTextTokens)
    fail(path, ": ", key, " must be [1..", kMaxTextTokens, ", ", text_channels, "] (model.config.text_in_channels), found ",
         t.sizes());
  if (!at::isFloatingType(t.scalar_type())) fail(path, ": ", key, " must be floating, found ", t.scalar_type());
  t = t.to(at::kFloat);
  if (!at::isfinite(t).all().item<bool>()) fail(path, ": ", key, " holds NaN or Inf");
  return t;
}

void write_json(const std::string& path, const nlohmann::json& j) { write_file_no_follow(path, j.dump(2) + "\n", path); }

void run_sample(const SampleOptions& o) {
  Config config = config_load(o.config_path, o.overrides);
  if (config.model.model_id != "magihuman")
    fail("sample magihuman: config ", o.config_path, " is a '", config.model.model_id, "' model");
  config.training.save.clear();
  config.training.load.clear();
  config.training.async_save = false;
  config.training.keep_best = 0;
  const auto model_config = magihuman::MagiHumanConfig::from_json(config.model.config);
  const auto [height, width] = parse_resolution(o.resolution, 32, "--resolution");
  if (!(o.seconds > 0 && o.seconds <= kMaxSeconds)) fail("--seconds must be in (0, ", kMaxSeconds, "], found ", o.seconds);
  const auto shape = sample::MagiHumanLatentShape::of_clip(o.seconds, height, width, model_config.video_in_channels,
                                                           model_config.audio_in_channels);
  sample::MagiHumanSampling settings;
  settings.steps = o.steps;
  settings.shift = o.shift;
  settings.guidance_video = o.guidance_video;
  settings.guidance_audio = o.guidance_audio;
  if (!std::isfinite(o.guidance_video) || !std::isfinite(o.guidance_audio))
    fail("--guidance-video and --guidance-audio must be finite, found ", o.guidance_video, " and ", o.guidance_audio);
  if (!(o.shift > 0 && std::isfinite(o.shift))) fail("--shift must be > 0, found ", o.shift);
  if (o.steps < 1 || o.steps > 1000) fail("--steps must be in 1..1000, found ", o.steps);
  if (o.vae.empty() != o.audio_vae.empty()) fail("--vae and --audio-vae go together (both decode the sample)");
  if (!o.text_encoder.empty() && !o.negative_conditions.empty())
    fail("give --text-encoder (it embeds upstream's negative prompt) or --negative-conditions, not both");
  const std::vector<Prompt> prompts = read_prompts(o.prompts, o.seed);
  bool any_text = false;
  for (const auto& p : prompts) any_text = any_text || !p.text.empty();
  if (any_text && o.text_encoder.empty()) fail(o.prompts, ": a prompt is text: give --text-encoder to embed it");

  auto runtime = runtime_init(LaunchEnv::from_environment(), default_device(),
                              std::chrono::seconds(config.parallel.timeout_s));
  Run run;
  run.config = std::move(config);
  run.runtime = std::move(runtime);
  const Config& c = run.config;
  make_new_output_dir(run, o.out, "--out");

  // The embeddings: each text prompt's and the negative prompt's, written by the media room into a
  // scratch directory inside --out (removed on every exit), read by every rank.
  const bool negative_from_encoder = !o.text_encoder.empty();
  std::vector<at::Tensor> embeddings(prompts.size());
  std::optional<at::Tensor> negative;
  const std::string prefix = ".embeddings_";
  std::unique_ptr<ScratchDir> scratch;
  if (any_text || negative_from_encoder) {
    double id = 0;
    on_rank0_while_others_wait(run, "sample: the prompt embeddings", [&] {
      scratch = std::make_unique<ScratchDir>(o.out, prefix);
      nlohmann::json texts = nlohmann::json::array();
      for (const auto& p : prompts) texts.push_back(p.text.empty() ? std::string("unused") : p.text);
      const std::string list = scratch->path() + "/prompts.json";
      write_json(list, texts);
      const bool cuda = run.comm().device().is_cuda();
      const std::string device = o.text_device.empty() ? (cuda ? "cuda" : "cpu") : o.text_device;
      run.log("embedding " + std::to_string(prompts.size()) + " prompt(s) and the negative prompt with " + o.text_encoder);
      run_media_module("embed", {"--text-encoder", o.text_encoder, "--prompts", list, "--out", scratch->path(),
                 "--device", device, "--dtype", device == "cuda" ? "bf16" : "fp32", "--negative"},
                scratch->path() + "/embed.log", "the prompt embeddings (mmtrain_media.embed)");
    });
    if (run.is_rank0()) id = static_cast<double>(scratch->id());
    const std::string dir = ScratchDir::path_of(o.out, prefix, static_cast<uint64_t>(run.comm().all_reduce_sum(id)));
    for (size_t i = 0; i < prompts.size(); ++i)
      if (!prompts[i].text.empty())
        embeddings[i] = read_embedding(dir + "/prompt_" + std::to_string(i) + ".safetensors", model_config.text_in_channels);
    negative = read_embedding(dir + "/negative.safetensors", model_config.text_in_channels);
    run.comm().barrier();  // every rank has read them before rank 0 removes the directory
    scratch.reset();
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].text.empty()) embeddings[i] = read_embedding(prompts[i].conditions, model_config.text_in_channels);
  if (!o.negative_conditions.empty()) negative = read_embedding(o.negative_conditions, model_config.text_in_channels);
  if (!negative)
    run.log("no --text-encoder or --negative-conditions: sampling without guidance (upstream's cfg_number 1: one "
            "forward a step, the DDIM-style update)");

  // The model: FSDP over the ranks as the config shards it, forward only (no optimizer, no data).
  build_tool_model(run, "sample magihuman");
  load_tool_weights(run, o.load, "sample --load", ".sample_from_dcp_");

  at::NoGradGuard no_grad;
  auto forward = [&](const Batch& batch) {
    Batch on_device = batch;
    for (auto& [key, tensor] : on_device) tensor = tensor.to(run.comm().device());
    run.fsdp->begin_forward();
    const ModelOutput out = run.model->forward(on_device);
    run.fsdp->finish_forward_only();
    return out.tensors.at("prediction").to(at::kCPU);
  };
  // Prompt i goes to data-parallel rank i % dp; a rank with fewer prompts samples prompt 0 again
  // and drops it, as FSDP's gathers need every rank in every forward.
  const int64_t dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank(), count = static_cast<int64_t>(prompts.size());
  for (int64_t round = 0; round < (count + dp - 1) / dp; ++round) {
    const int64_t index = round * dp + dp_rank;
    const bool padding = index >= count;
    const Prompt& p = prompts[padding ? 0 : index];
    const auto began = std::chrono::steady_clock::now();
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(p.seed);
    const auto s = sample::sample_magihuman(forward, embeddings[padding ? 0 : index], negative, shape, settings,
                                            generator, model_config.io_width(), model_config.out_width());
    if (padding) continue;
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    const std::string stem = (fs::path(o.out) / format("%04lld", static_cast<long long>(index))).string();
    const at::Tensor tokens = s.video.reshape({shape.latent_channels, shape.frames, shape.height / 2, 2, shape.width / 2, 2})
                                  .permute({1, 2, 4, 0, 3, 5})
                                  .reshape({-1, 4 * shape.latent_channels});
    safetensors_write(stem + ".safetensors",
                      {{"video_latent", tokens.contiguous()},
                       {"video_grid_thw", at::tensor({shape.frames, shape.height / 2, shape.width / 2}, at::kLong)},
                       {"audio_latent", s.audio.contiguous()}});
    nlohmann::json record = {{"index", index}, {"seed", p.seed}, {"steps", settings.steps}, {"shift", settings.shift},
                             {"guidance_video", settings.guidance_video},
                             {"guidance_video_low_noise", settings.guidance_video_low_noise},
                             {"guidance_switch_timestep", settings.guidance_switch_timestep},
                             {"guidance_audio", settings.guidance_audio}, {"cfg_number", negative ? 2 : 1},
                             {"seconds", o.seconds}, {"resolution", {height, width}}, {"load", o.load},
                             {"video_latent", tokens.sizes().vec()}, {"audio_latent", s.audio.sizes().vec()},
                             {"sampling_s", took}};
    if (p.text.empty()) record["conditions"] = p.conditions;
    else record["prompt"] = p.text;
    write_json(stem + ".json", record);
    std::printf("[mmtrain] sample %lld: %s.safetensors (%.1f s)\n", static_cast<long long>(index), stem.c_str(), took);
    std::fflush(stdout);
  }
  run.comm().barrier();
  if (o.vae.empty()) return;
  on_rank0_while_others_wait(run, "sample: decoding", [&] {
    const bool cuda = run.comm().device().is_cuda();
    run_media_module("decode", {"--beside", "--input", o.out, "--out", o.out, "--vae", o.vae, "--audio-vae",
               o.audio_vae, "--device", cuda ? "cuda" : "cpu", "--dtype", cuda ? "bf16" : "fp32", "--fps", "25"},
              (fs::path(o.out) / ".decode.log").string(), "decoding the samples (mmtrain_media.decode)");
    run.log("decoded the samples to " + o.out + "/<index>.mp4");
  });
}


const CliRegistration sample_command(
    sample_registry(), "magihuman",
    {"clips with sound from prompts: upstream's base sampler (FlowUniPC, classifier-free guidance)", [](CLI::App& command) {
  auto* cmd = &command;
  auto o = std::make_shared<SampleOptions>();
  cmd->add_option("config", o->config_path, "YAML config of the model (its model section and parallelism)")->required();
  cmd->add_option("--load", o->load, "mmtrain checkpoint, HF model directory or DCP")->required();
  cmd->add_option("--prompts", o->prompts, "JSONL: {\"prompt\": TEXT, \"seed\": N} or {\"conditions\": FILE, \"seed\": N} "
                  "a line")->required();
  cmd->add_option("--out", o->out, "output directory (new): <index>.safetensors, .json and, decoded, .mp4")->required();
  cmd->add_option("--text-encoder", o->text_encoder, "T5Gemma: embeds text prompts and upstream's negative prompt");
  cmd->add_option("--text-device", o->text_device, "where T5Gemma runs (default: the run's device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--negative-conditions", o->negative_conditions, "the negative prompt's precomputed embedding");
  cmd->add_option("--vae", o->vae, "the Wan2.2 VAE (diffusers): decode to <index>.mp4 (with --audio-vae)");
  cmd->add_option("--audio-vae", o->audio_vae, "Stable Audio Open's VAE (diffusers)");
  cmd->add_option("--steps", o->steps, "denoising steps")->capture_default_str();
  cmd->add_option("--shift", o->shift, "the schedule's shift")->capture_default_str();
  cmd->add_option("--guidance-video", o->guidance_video, "video text guidance (upstream uses 2.0 below t = 500)")
      ->capture_default_str();
  cmd->add_option("--guidance-audio", o->guidance_audio, "audio text guidance")->capture_default_str();
  cmd->add_option("--seconds", o->seconds, "clip length (a whole number of frames at 25 fps)")->capture_default_str();
  cmd->add_option("--resolution", o->resolution, "HxW, multiples of 32")->capture_default_str();
  cmd->add_option("--seed", o->seed, "the first prompt's seed when its line gives none (then +1 a prompt)")
      ->capture_default_str();
  cmd->add_option("--set", o->overrides, "override a config key (repeatable)");
  return [o] { run_sample(*o); };
}});


}  // namespace

}  // namespace mmtrain
