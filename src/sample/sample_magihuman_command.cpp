// `mmtrain sample magihuman CONFIG --load DIR --prompts FILE --out DIR`: MagiHuman clips from prompts,
// with upstream's base sampler (sample/magihuman_sampler.h) running in the C++ model, FSDP-sharded
// over the ranks, the prompts split over the data-parallel ranks. Prompt text is embedded by the
// media room's T5Gemma (python/mmtrain_py/media/embed.py) before the model is built; the latents are
// decoded to mp4 by its VAEs (decode.py) when --vae and --audio-vae are given. docs/sampling.md.
#include "cli/options.h"
#include "cli/python_runner.h"
#include "cli/tool_run.h"
#include "config/config.h"
#include "convert/model_weights.h"
#include "core/cli_command.h"
#include "core/error.h"
#include "core/scratch_dir.h"
#include "dist/runtime.h"
#include "io/user_file.h"
#include "models/magihuman/config.h"
#include "sample/magihuman_prompts.h"
#include "train/run.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>

namespace mmtrain {

namespace {

namespace fs = std::filesystem;

struct SampleOptions {
  std::string config_path, load, prompts, out, text_encoder, negative_conditions, vae, audio_vae, text_device;
  std::string resolution = "256x480";
  double seconds = 5.0, shift = 5.0, guidance_video = 5.0, guidance_audio = 5.0;
  int64_t steps = 32;
  uint64_t seed = 0;
  bool ema = false;
  ConfigOverrides overrides;
};

void write_json(const std::string& path, const nlohmann::json& j) { write_file_no_follow(path, j.dump(2) + "\n", path); }

void run_sample(const SampleOptions& o) {
  Config config = load_tool_config(o.config_path, o.overrides.resolved(), "magihuman", "sample magihuman");
  const auto model_config = magihuman::MagiHumanConfig::from_json(config.model.config);
  sample::MagiHumanSampleSettings defaults;
  std::tie(defaults.height, defaults.width) = parse_resolution(o.resolution, 32, "--resolution");
  defaults.seconds = o.seconds;
  defaults.sampling.steps = o.steps;
  defaults.sampling.shift = o.shift;
  defaults.sampling.guidance_video = o.guidance_video;
  defaults.sampling.guidance_audio = o.guidance_audio;
  if (o.vae.empty() != o.audio_vae.empty()) fail("--vae and --audio-vae go together (both decode the sample)");
  if (!o.text_encoder.empty() && !o.negative_conditions.empty())
    fail("give --text-encoder (it embeds upstream's negative prompt) or --negative-conditions, not both");
  std::vector<sample::MagiHumanPrompt> prompts = sample::read_magihuman_prompts(o.prompts, o.seed, defaults);
  bool any_text = false;
  for (const auto& p : prompts) any_text = any_text || !p.text.empty();
  if (any_text && o.text_encoder.empty()) fail(o.prompts, ": a prompt is text: give --text-encoder to embed it");

  Run run;
  start_tool_run(run, std::move(config));
  make_new_output_dir(run, o.out, "--out");

  // The embeddings: each text prompt's and the negative prompt's, written by the media room into a
  // scratch directory inside --out (removed on every exit), read by every rank.
  const bool negative_from_encoder = !o.text_encoder.empty();
  std::optional<at::Tensor> negative;
  const std::string prefix = ".embeddings_";
  if (any_text || negative_from_encoder) {
    std::unique_ptr<ScratchDir> scratch;
    on_rank0_while_others_wait(run, "sample: the prompt embeddings", [&] {
      scratch = std::make_unique<ScratchDir>(o.out, prefix);
      nlohmann::json texts = nlohmann::json::array();
      for (const auto& p : prompts) texts.push_back(p.text.empty() ? std::string("unused") : p.text);
      const std::string list = scratch->path() + "/prompts.json";
      write_json(list, texts);
      const bool cuda = run.comm().device().is_cuda();
      const std::string device = o.text_device.empty() ? (cuda ? "cuda" : "cpu") : o.text_device;
      run.log("embedding " + std::to_string(prompts.size()) + " prompt(s) and the negative prompt with " + o.text_encoder);
      run_python_module("media.embed", {"--text-encoder", o.text_encoder, "--prompts", list, "--out", scratch->path(),
                 "--device", device, "--dtype", device == "cuda" ? "bf16" : "fp32", "--negative"},
                scratch->path() + "/embed.log", "the prompt embeddings (mmtrain_py.media.embed)");
    });
    const RankScratchDir shared(run, std::move(scratch), o.out, prefix);
    const std::string& dir = shared.path();
    for (size_t i = 0; i < prompts.size(); ++i)
      if (!prompts[i].text.empty())
        prompts[i].embedding = sample::read_text_embedding(dir + "/prompt_" + std::to_string(i) + ".safetensors",
                                                           model_config.text_in_channels);
    negative = sample::read_text_embedding(dir + "/negative.safetensors", model_config.text_in_channels);
    run.comm().barrier();  // every rank has read them before rank 0 removes the directory
  }
  if (!o.negative_conditions.empty()) negative = sample::read_text_embedding(o.negative_conditions, model_config.text_in_channels);
  sample::read_magihuman_embeddings(prompts, model_config.text_in_channels, negative);
  if (std::any_of(prompts.begin(), prompts.end(), [](const auto& p) { return !p.negative; }))
    run.log("a prompt has no negative embedding (no --text-encoder, --negative-conditions or its line's "
            "negative_conditions): it samples without guidance (upstream's cfg_number 1: one forward a step, the "
            "DDIM-style update)");

  // The model: FSDP over the ranks as the config shards it, forward only (no optimizer, no data).
  build_tool_model(run);
  load_tool_weights(run, o.load, "sample --load", ".sample_from_dcp_", o.ema);

  sample::sample_magihuman_prompts(run, prompts, o.out, o.load);
  if (o.vae.empty()) return;
  on_rank0_while_others_wait(run, "sample: decoding", [&] {
    const bool cuda = run.comm().device().is_cuda();
    run_python_module("media.decode", {"--beside", "--input", o.out, "--out", o.out, "--vae", o.vae, "--audio-vae",
               o.audio_vae, "--device", cuda ? "cuda" : "cpu", "--dtype", cuda ? "bf16" : "fp32", "--fps", "25"},
              (fs::path(o.out) / ".decode.log").string(), "decoding the samples (mmtrain_py.media.decode)");
    run.log("decoded the samples to " + o.out + "/<index>.mp4");
  });
}

const CliRegistration sample_command(
    sample_registry(), "magihuman",
    {"clips with sound from prompts: upstream's base sampler (FlowUniPC, classifier-free guidance)",
     [](CLI::App& command) {
       auto* cmd = &command;
       auto o = std::make_shared<SampleOptions>();
       cmd->add_option("config", o->config_path, "YAML config of the model (its model section and parallelism)")->required();
       cmd->add_option("--load", o->load, "mmtrain checkpoint, HF model directory or DCP")->required();
       cmd->add_flag("--ema", o->ema, "sample with the checkpoint's EMA weights (training.ema)");
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
       o->overrides.add_options(cmd, "parallel.fsdp_plan.cpu_offload=true");
       return [o] { run_sample(*o); };
     }});


}  // namespace

}  // namespace mmtrain
