#include "sample/magihuman_prompts.h"

#include "cli/options.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "models/magihuman/config.h"
#include "nn/sequence_split.h"
#include "parallel/context_parallel.h"
#include "train/run.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

namespace mmtrain::sample {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxPrompts = 10000;
constexpr double kMaxSeconds = 600;
// Settings far outside these make the schedule or the guided velocity overflow to NaN/Inf
// (a shift of 1e-300 collapses every timestep to 0); upstream's are 5 and 5 / 2.5.
constexpr double kMinShift = 1e-2, kMaxShift = 100;
constexpr double kMaxGuidance = 100;

// A torch.save file (a zip: what `fixture magihuman` and training's .pt layout hold) is named, not
// parsed as a safetensors header ("header length ... runs past the end").
void refuse_torch_save(const std::string& path) {
  std::error_code error;
  char magic[4] = {};
  if (fs::is_regular_file(fs::symlink_status(path, error)))  // a regular file: reading it cannot block
    std::ifstream(path, std::ios::binary).read(magic, sizeof magic);
  if (std::string(magic, sizeof magic) == std::string("PK\x03\x04", 4))
    fail(path, ": a torch.save (.pt) file; conditions must be safetensors with 'prompt_embeds' (the conditions/ files ",
         "of `mmtrain prepare magihuman`)");
}

// FILE relative to base, refused unless it resolves inside base.
std::string inside(const fs::path& base, const std::string& relative, const std::string& where, const char* key) {
  if (!relative.empty() && fs::path(relative).is_absolute())
    fail(where, ": '", key, "' ", printable(relative), " is an absolute path, which is refused: give a path relative to ",
         base.string(), " (the prompts file's folder) and inside it");
  const fs::path joined = base / relative;
  const fs::path resolved = fs::weakly_canonical(joined);
  const auto [end, _] = std::mismatch(base.begin(), base.end(), resolved.begin(), resolved.end());
  if (relative.empty() || fs::path(relative).is_absolute() || end != base.end())
    fail(where, ": '", key, "' ", printable(relative), " must be a file inside ", base.string());
  return joined.string();
}

double finite_number(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j[key].is_number()) fail(where, ": '", key, "' must be a number");
  const double value = j[key].get<double>();
  if (!std::isfinite(value)) fail(where, ": '", key, "' must be finite, found ", value);
  return value;
}

// Checks a prompt's settings whatever their source (flags or line): the errors name `where`.
void check_settings(const MagiHumanSampleSettings& s, const std::string& where) {
  if (!(s.seconds > 0 && s.seconds <= kMaxSeconds))
    fail(where, ": seconds must be in (0, ", kMaxSeconds, "], found ", s.seconds);
  MagiHumanLatentShape::of_clip(s.seconds, s.height, s.width, 4, 1);  // whole frames, multiples of 32
  if (s.sampling.steps < 1 || s.sampling.steps > 1000)
    fail(where, ": steps must be in 1..1000, found ", s.sampling.steps);
  if (!(s.sampling.shift >= kMinShift && s.sampling.shift <= kMaxShift))
    fail(where, ": shift must be in [", kMinShift, ", ", kMaxShift, "], found ", s.sampling.shift);
  for (const double g : {s.sampling.guidance_video, s.sampling.guidance_audio})
    if (!(std::abs(g) <= kMaxGuidance))
      fail(where, ": the guidance scales must be finite and in [-", kMaxGuidance, ", ", kMaxGuidance, "], found ",
           s.sampling.guidance_video, " and ", s.sampling.guidance_audio);
}

}  // namespace

std::vector<MagiHumanPrompt> read_magihuman_prompts(const std::string& path, uint64_t default_seed,
                                                    const MagiHumanSampleSettings& defaults) {
  check_settings(defaults, "the settings (--seconds, --resolution, --steps, --shift, --guidance-*)");
  const std::string text = read_user_file(path, "prompts", int64_t{16} << 20);
  const fs::path base = fs::weakly_canonical(fs::absolute(path)).parent_path();
  const char* known[] = {"prompt", "conditions", "seed", "negative_conditions", "seconds", "resolution", "steps",
                         "shift", "guidance_video", "guidance_audio"};
  std::vector<MagiHumanPrompt> prompts;
  std::istringstream lines(text);
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (trim(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(number);
    const nlohmann::json j = json_parse_checked(line, where);
    if (!j.is_object()) fail(where, ": expected an object {\"prompt\": TEXT, \"seed\": N}");
    for (const auto& [key, _] : j.items())
      if (std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) == std::end(known))
        fail(where, ": unknown key '", printable(key), "' (",
             join(std::vector<std::string>(std::begin(known), std::end(known)), ", "), ")");
    MagiHumanPrompt p;
    p.seed = default_seed + prompts.size();
    p.settings = defaults;
    if (j.contains("seed")) {
      if (!j["seed"].is_number_unsigned()) fail(where, ": 'seed' must be an integer >= 0");
      p.seed = j["seed"].get<uint64_t>();
    }
    if (j.contains("prompt") == j.contains("conditions"))
      fail(where, ": give exactly one of 'prompt' and 'conditions'");
    if (j.contains("prompt")) {
      p.text = json_string(j, "prompt", where);
      if (trim(p.text).empty()) fail(where, ": the prompt is empty");
    } else {
      p.conditions = inside(base, json_string(j, "conditions", where), where, "conditions");
      refuse_torch_save(p.conditions);
    }
    if (j.contains("negative_conditions")) {
      p.negative_conditions = inside(base, json_string(j, "negative_conditions", where), where, "negative_conditions");
      refuse_torch_save(p.negative_conditions);
    }
    p.sized = j.contains("seconds") && j.contains("resolution");
    if (j.contains("seconds")) p.settings.seconds = finite_number(j, "seconds", where);
    if (j.contains("resolution")) {
      const auto [h, w] = parse_resolution(json_string(j, "resolution", where), 32, where + ": 'resolution'");
      p.settings.height = h;
      p.settings.width = w;
    }
    if (j.contains("steps")) {
      if (!j["steps"].is_number_integer()) fail(where, ": 'steps' must be an integer");
      p.settings.sampling.steps = j["steps"].get<int64_t>();
    }
    if (j.contains("shift")) p.settings.sampling.shift = finite_number(j, "shift", where);
    if (j.contains("guidance_video")) p.settings.sampling.guidance_video = finite_number(j, "guidance_video", where);
    if (j.contains("guidance_audio")) p.settings.sampling.guidance_audio = finite_number(j, "guidance_audio", where);
    check_settings(p.settings, where);
    prompts.push_back(std::move(p));
    if (static_cast<int64_t>(prompts.size()) > kMaxPrompts) fail(path, ": more than ", kMaxPrompts, " prompts");
  }
  if (prompts.empty()) fail(path, ": no prompts (one JSON object a line)");
  return prompts;
}

at::Tensor read_text_embedding(const std::string& path, int64_t text_channels) {
  refuse_torch_save(path);
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

void read_magihuman_embeddings(std::vector<MagiHumanPrompt>& prompts, int64_t text_channels,
                               const std::optional<at::Tensor>& negative) {
  for (auto& p : prompts) {
    if (p.text.empty()) p.embedding = read_text_embedding(p.conditions, text_channels);
    p.negative = p.negative_conditions.empty() ? negative : read_text_embedding(p.negative_conditions, text_channels);
  }
}

void sample_magihuman_prompts(Run& run, const std::vector<MagiHumanPrompt>& prompts, const std::string& out_dir,
                              const std::string& load) {
  const auto model_config = magihuman::MagiHumanConfig::from_json(run.config.model.config);
  at::NoGradGuard no_grad;
  // Under context parallelism the CP ranks share one prompt: the model predicts this rank's rows of
  // the split it makes of the packed stream (full attention), and the sampler needs them all.
  std::optional<ContextParallel> context;
  if (run.mesh->shape().cp() > 1) context.emplace(run.mesh->ring(), run.mesh->ulysses(), run.mesh->cp());
  auto forward = [&](const Batch& batch) {
    Batch on_device = batch;
    for (auto& [key, tensor] : on_device) tensor = tensor.to(run.comm().device());
    run.fsdp->begin_forward();
    const ModelOutput out = run.model->forward(on_device);
    run.fsdp->finish_forward_only();
    at::Tensor prediction = out.tensors.at("prediction");
    if (context) {
      const at::Tensor& cu_seqlens = batch.at("cu_seqlens");
      const auto rows = cu_seqlens_from(cu_seqlens, cu_seqlens[-1].item<int64_t>(), "a sample's cu_seqlens");
      prediction = context->shard(rows, /*causal=*/false)->gather(prediction);
    }
    return prediction.to(at::kCPU);
  };
  const bool writes = !context || run.mesh->cp()->rank() == 0;  // one writer per prompt
  // Every rank must run as many forwards as the others (each is a sequence of FSDP gathers), but
  // prompts differ in steps and guidance: a rank whose prompt needs fewer runs the difference on a
  // one-token-per-modality batch after it. Every rank knows every prompt, so no collective is needed.
  auto forwards_of = [&](int64_t i) {
    const auto& p = prompts[i < static_cast<int64_t>(prompts.size()) ? i : 0];
    return p.settings.sampling.steps * (p.negative ? 2 : 1);
  };
  const Batch idle = pack_magihuman_input(at::zeros({model_config.video_in_channels / 4, 1, 2, 2}),
                                          at::zeros({1, model_config.audio_in_channels}),
                                          at::zeros({1, model_config.text_in_channels}), model_config.io_width(),
                                          model_config.out_width());
  const int64_t dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank(), count = static_cast<int64_t>(prompts.size());
  std::string non_finite;  // a prompt whose latents overflowed: named after every rank is done
  for (int64_t round = 0; round < (count + dp - 1) / dp; ++round) {
    const int64_t index = round * dp + dp_rank;
    const bool padding = index >= count;
    const MagiHumanPrompt& p = prompts[padding ? 0 : index];
    int64_t most = 0;
    for (int64_t r = 0; r < dp; ++r) most = std::max(most, forwards_of(round * dp + r));
    for (int64_t extra = forwards_of(index); extra < most; ++extra) forward(idle);
    const auto& s = p.settings;
    const auto shape = MagiHumanLatentShape::of_clip(s.seconds, s.height, s.width, model_config.video_in_channels,
                                                     model_config.audio_in_channels);
    const auto began = std::chrono::steady_clock::now();
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(p.seed);
    const auto result = sample_magihuman(forward, p.embedding, p.negative, shape, s.sampling, generator,
                                         model_config.io_width(), model_config.out_width());
    if (padding || !writes) continue;
    if (!at::isfinite(result.video).all().item<bool>() || !at::isfinite(result.audio).all().item<bool>()) {
      if (non_finite.empty())
        non_finite = format("prompt %lld (seed %llu): its latents hold NaN or Inf (steps %lld, shift %g, guidance %g / "
                            "%g); nothing was written for it", static_cast<long long>(index),
                            static_cast<unsigned long long>(p.seed), static_cast<long long>(s.sampling.steps),
                            s.sampling.shift, s.sampling.guidance_video, s.sampling.guidance_audio);
      continue;
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    const std::string stem = (fs::path(out_dir) / format("%04lld", static_cast<long long>(index))).string();
    const at::Tensor tokens = video_tokens(result.video);
    safetensors_write(stem + ".safetensors",
                      {{"video_latent", tokens.contiguous()},
                       {"video_grid_thw", at::tensor({shape.frames, shape.height / 2, shape.width / 2}, at::kLong)},
                       {"audio_latent", result.audio.contiguous()}});
    nlohmann::json record = {{"index", index}, {"seed", p.seed}, {"steps", s.sampling.steps},
                             {"shift", s.sampling.shift},
                             {"guidance_video", s.sampling.guidance_video},
                             {"guidance_video_low_noise", s.sampling.guidance_video_low_noise},
                             {"guidance_switch_timestep", s.sampling.guidance_switch_timestep},
                             {"guidance_audio", s.sampling.guidance_audio}, {"cfg_number", p.negative ? 2 : 1},
                             {"seconds", s.seconds}, {"resolution", {s.height, s.width}}, {"load", load},
                             {"video_latent", tokens.sizes().vec()}, {"audio_latent", result.audio.sizes().vec()},
                             {"sampling_s", took}};
    if (p.text.empty()) record["conditions"] = p.conditions;
    else record["prompt"] = p.text;
    write_file_no_follow(stem + ".json", record.dump(2) + "\n", stem + ".json");
    std::printf("[mmtrain] sample %lld: %s.safetensors (%.1f s)\n", static_cast<long long>(index), stem.c_str(), took);
    std::fflush(stdout);
  }
  if (run.comm().any_rank(!non_finite.empty()))
    fail("sampling: ", non_finite.empty() ? std::string("a prompt on another rank overflowed (see its error)") : non_finite);
}

}  // namespace mmtrain::sample
