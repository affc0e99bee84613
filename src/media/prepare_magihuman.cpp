#include "cli/options.h"
#include "cli/python_runner.h"

#include "config/config.h"
#include "core/cli_command.h"
#include "core/error.h"
#include "models/magihuman/config.h"

#include <ATen/Context.h>
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPixelsPerToken = 32;  // the VAE's 16x16 stride times the 2x2 patch (resolutions' multiple)
constexpr int64_t kFps = 25;             // MagiHuman's frame rate (python/mmtrain_py/media/spec.py)
constexpr double kAudioSampleRate = 51200;  // spec.py's AUDIO_SAMPLE_RATE
constexpr double kAudioHop = 2048;          // spec.py's AUDIO_HOP: samples per audio latent frame

void require_directory(const std::string& path, const std::string& flag) {
  std::error_code error;
  if (!fs::is_directory(path, error)) fail(flag, " ", path, ": not a directory");
}


struct PrepareOptions {
  std::string input, out, vae, audio_vae, text_encoder;
  std::string resolution = "256x480";
  int64_t fps = kFps;
  double max_seconds = 20.0;
  int64_t max_source_pixels = 7680LL * 4320;  // 8K
  double audio_window_seconds = 29.0;
  std::string device, dtype, text_device;
  uint64_t seed = 0;
  bool vae_tiling = false, resume = false, decode = false;
};

void run_prepare(const PrepareOptions& o) {
  const std::string device = o.device.empty() ? (at::hasCUDA() ? "cuda" : "cpu") : o.device;
  // bf16 is upstream's dtype on a GPU; on a CPU bf16 convolutions are slow and gain nothing.
  const std::string dtype = o.dtype.empty() ? (device == "cuda" ? "bf16" : "fp32") : o.dtype;
  if (device == "cuda" && !at::hasCUDA()) fail("prepare: --device cuda, but this machine or mmtrain has no CUDA");
  require_directory(o.vae, "--vae");
  require_directory(o.audio_vae, "--audio-vae");
  if (o.decode) {
    require_directory(o.input, "--input");
    require_new_path(o.out, "--out");
    exec_python_module("media.decode", {"--input", o.input, "--out", o.out, "--vae", o.vae, "--audio-vae", o.audio_vae,
                                 "--device", device, "--dtype", dtype, "--fps", std::to_string(o.fps)});
  }
  if (o.text_encoder.empty()) fail("prepare magihuman: --text-encoder is required (unless --decode)");
  require_directory(o.text_encoder, "--text-encoder");
  const auto [height, width] = parse_resolution(o.resolution, kPixelsPerToken, "--resolution");
  if (!(o.max_seconds > 0 && o.max_seconds <= 3600)) fail("--max-seconds must be in (0, 3600], found ", o.max_seconds);
  if (!(o.audio_window_seconds >= 0.2 && o.audio_window_seconds <= 600))
    fail("--audio-window-seconds must be in [0.2, 600], found ", o.audio_window_seconds);
  // Whole latent frames: a window of 0.3 s is 7.5 of them, and a truncated count would drop the last.
  const double window_samples = o.audio_window_seconds * kAudioSampleRate;
  const double frames = std::round(window_samples / kAudioHop);
  if (std::abs(window_samples - frames * kAudioHop) > 1e-6 * window_samples)
    fail("--audio-window-seconds ", o.audio_window_seconds, " is ", window_samples, " samples, not a whole number of ",
         kAudioHop, "-sample audio latent frames; use a multiple of 0.04 s (e.g. ", frames * kAudioHop / kAudioSampleRate,
         ")");
  if (o.max_source_pixels < height * width)
    fail("--max-source-pixels ", o.max_source_pixels, " is below the output resolution's ", height * width);
  if (!o.resume) require_new_path(o.out, "--out", " (or --resume to finish it)");
  std::vector<std::string> args = {"--input", o.input, "--out", o.out, "--vae", o.vae, "--audio-vae", o.audio_vae,
                                   "--text-encoder", o.text_encoder, "--device", device, "--dtype", dtype,
                                   "--text-device", o.text_device.empty() ? device : o.text_device,
                                   "--height", std::to_string(height), "--width", std::to_string(width),
                                   "--fps", std::to_string(o.fps), "--max-seconds", argument_number(o.max_seconds),
                                   "--max-source-pixels", std::to_string(o.max_source_pixels),
                                   "--audio-window-seconds", argument_number(o.audio_window_seconds),
                                   "--seed", std::to_string(o.seed)};
  if (o.vae_tiling) args.push_back("--vae-tiling");
  if (o.resume) args.push_back("--resume");
  exec_python_module("media.prepare", args);
}

const CliRegistration prepare_command(
    prepare_registry(), "magihuman",
    {"clips (video, sound, caption) -> the magihuman_precomputed layout, or back with --decode",
     [](CLI::App& command) {
       auto* cmd = &command;
       auto o = std::make_shared<PrepareOptions>();
       cmd->add_option("--input", o->input, "a directory of clips (<stem>.mp4|mkv|webm|mov + <stem>.txt [+ <stem>.wav|flac]) "
                       "or a JSONL manifest; with --decode, a prepared directory")->required();
       cmd->add_option("--out", o->out, "output directory (new, or the one --resume finishes)")->required();
       cmd->add_option("--vae", o->vae, "the Wan2.2 VAE (diffusers AutoencoderKLWan directory)")->required();
       cmd->add_option("--audio-vae", o->audio_vae, "Stable Audio Open's VAE (diffusers AutoencoderOobleck directory)")
           ->required();
       cmd->add_option("--text-encoder", o->text_encoder, "T5Gemma (transformers directory with its tokenizer)");
       cmd->add_option("--resolution", o->resolution, "output HxW, multiples of 32")->capture_default_str();
       cmd->add_option("--fps", o->fps, "frames per second of the output (MagiHuman trains at 25)")
           ->capture_default_str()->check(CLI::Range(1, 120));
       cmd->add_option("--max-seconds", o->max_seconds, "a longer clip keeps its first S seconds")->capture_default_str();
       cmd->add_option("--max-source-pixels", o->max_source_pixels, "a source frame with more pixels is refused")
           ->capture_default_str();
       cmd->add_option("--audio-window-seconds", o->audio_window_seconds,
                       "the audio VAE's window, overlapping by half (upstream's 29 s)")->capture_default_str();
       cmd->add_option("--device", o->device, "where the encoders run (default cuda when there is one)")
           ->check(CLI::IsMember({"cpu", "cuda"}));
       cmd->add_option("--dtype", o->dtype, "video VAE and text encoder weights (default bf16 on cuda, fp32 on cpu; the "
                       "audio VAE runs in fp32 as upstream)")->check(CLI::IsMember({"bf16", "fp32"}));
       cmd->add_option("--text-device", o->text_device, "where the text encoder runs (cpu keeps it off the GPU; "
                       "default --device)")->check(CLI::IsMember({"cpu", "cuda"}));
       cmd->add_option("--seed", o->seed, "seed of the audio posterior's noise (per clip: seed and stem)")
           ->capture_default_str();
       cmd->add_flag("--vae-tiling", o->vae_tiling, "encode in spatial tiles (diffusers' tiling: less memory, other numerics)");
       cmd->add_flag("--resume", o->resume, "finish an interrupted --out: clips whose files are complete are skipped");
       cmd->add_flag("--decode", o->decode, "the inverse: --input's latents back to <out>/<stem>.mp4 with sound");
       return [o] { run_prepare(*o); };
     }});


}  // namespace

}  // namespace mmtrain
