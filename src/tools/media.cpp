#include "tools/media.h"

#include "config/config.h"
#include "core/cli_command.h"
#include "core/error.h"
#include "core/subprocess.h"
#include "models/magihuman/config.h"
#include "tools/command.h"
#include "tools/plots.h"

#include <ATen/Context.h>
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kPixelsPerToken = 32;  // the VAE's 16x16 stride times the 2x2 patch
constexpr int64_t kFps = 25;             // MagiHuman's frame rate (python/mmtrain_media/spec.py)

void require_directory(const std::string& path, const std::string& flag) {
  std::error_code error;
  if (!fs::is_directory(path, error)) fail(flag, " ", path, ": not a directory");
}

// An output directory must be new: nothing is ever overwritten (--resume names the exception).
void require_absent(const std::string& path, const std::string& flag, const char* hint = "") {
  std::error_code error;
  if (fs::symlink_status(path, error).type() != fs::file_type::not_found)
    fail(flag, " ", path, " exists; give a new directory", hint);
}

std::string number(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
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
    require_absent(o.out, "--out");
    exec_media_module("decode", {"--input", o.input, "--out", o.out, "--vae", o.vae, "--audio-vae", o.audio_vae,
                                 "--device", device, "--dtype", dtype, "--fps", std::to_string(o.fps)});
  }
  if (o.text_encoder.empty()) fail("prepare magihuman: --text-encoder is required (unless --decode)");
  require_directory(o.text_encoder, "--text-encoder");
  const auto [height, width] = parse_resolution(o.resolution, kPixelsPerToken, "--resolution");
  if (!(o.max_seconds > 0 && o.max_seconds <= 3600)) fail("--max-seconds must be in (0, 3600], found ", o.max_seconds);
  if (!(o.audio_window_seconds >= 0.2 && o.audio_window_seconds <= 600))
    fail("--audio-window-seconds must be in [0.2, 600], found ", o.audio_window_seconds);
  if (o.max_source_pixels < height * width)
    fail("--max-source-pixels ", o.max_source_pixels, " is below the output resolution's ", height * width);
  if (!o.resume) require_absent(o.out, "--out", " (or --resume to finish it)");
  std::vector<std::string> args = {"--input", o.input, "--out", o.out, "--vae", o.vae, "--audio-vae", o.audio_vae,
                                   "--text-encoder", o.text_encoder, "--device", device, "--dtype", dtype,
                                   "--text-device", o.text_device.empty() ? device : o.text_device,
                                   "--height", std::to_string(height), "--width", std::to_string(width),
                                   "--fps", std::to_string(o.fps), "--max-seconds", number(o.max_seconds),
                                   "--max-source-pixels", std::to_string(o.max_source_pixels),
                                   "--audio-window-seconds", number(o.audio_window_seconds),
                                   "--seed", std::to_string(o.seed)};
  if (o.vae_tiling) args.push_back("--vae-tiling");
  if (o.resume) args.push_back("--resume");
  exec_media_module("prepare", args);
}

struct EncodersFixture {
  std::string out, config = "examples/magihuman/magihuman_tiny.yaml";
  uint64_t seed = 0;
};

// The three token widths come from the config's model (its defaults where it is silent), so the
// encoders' outputs fit the model that trains on them.
void run_encoders_fixture(const EncodersFixture& o) {
  const auto config = config_load(o.config);
  if (config.model.model_id != "magihuman")
    fail("fixture magihuman-encoders: ", o.config, ": model.model_id must be magihuman, found '", config.model.model_id, "'");
  const auto model = magihuman::MagiHumanConfig::from_json(config.model.config);
  require_absent(o.out, "--out");
  exec_media_module("fixtures", {"encoders", "--out", o.out, "--video-channels", std::to_string(model.video_in_channels),
                                 "--audio-channels", std::to_string(model.audio_in_channels), "--text-channels",
                                 std::to_string(model.text_in_channels), "--seed", std::to_string(o.seed)});
}

struct ClipsFixture {
  std::string out, size = "64x96";
  int64_t count = 4;
  double seconds = 2.0;
  uint64_t seed = 0;
};

void run_clips_fixture(const ClipsFixture& o) {
  const auto [height, width] = parse_resolution(o.size, 2, "--size");  // H.264's 4:2:0 needs even sides
  if (o.count < 1 || o.count > 10000) fail("--count must be in 1..10000, found ", o.count);
  if (!(o.seconds > 0 && o.seconds <= 600)) fail("--seconds must be in (0, 600], found ", o.seconds);
  if (height * width > 1920 * 1080) fail("--size ", o.size, ": fixture clips are at most 1920x1080");
  require_absent(o.out, "--out");
  exec_media_module("fixtures", {"clips", "--out", o.out, "--count", std::to_string(o.count), "--seconds",
                                 number(o.seconds), "--height", std::to_string(height), "--width", std::to_string(width),
                                 "--seed", std::to_string(o.seed)});
}

const FixtureRegistration encoders_fixture(
    "magihuman-encoders",
    {"tiny random-weight MagiHuman encoders of the real classes (Wan2.2 VAE, Oobleck VAE, T5Gemma) sized to a config",
     [](CLI::App& cmd) {
       auto o = std::make_shared<EncodersFixture>();
       cmd.add_option("--out", o->out, "output directory (new): DIR/vae, DIR/audio_vae, DIR/text_encoder")->required();
       cmd.add_option("--config", o->config, "YAML config whose model.config sets the three channel widths")
           ->capture_default_str();
       cmd.add_option("--seed", o->seed, "random seed")->capture_default_str();
       return [o] { run_encoders_fixture(*o); };
     }});

const FixtureRegistration clips_fixture(
    "clips",
    {"synthetic 25 fps clips with a sound track (a moving square and a tone) and captions, for `prepare magihuman`",
     [](CLI::App& cmd) {
       auto o = std::make_shared<ClipsFixture>();
       cmd.add_option("--out", o->out, "output directory (new): clip_NNN.mp4 and clip_NNN.txt")->required();
       cmd.add_option("--count", o->count, "number of clips")->capture_default_str();
       cmd.add_option("--seconds", o->seconds, "length of each clip")->capture_default_str();
       cmd.add_option("--size", o->size, "frame size HxW (even sides)")->capture_default_str();
       cmd.add_option("--seed", o->seed, "random seed of the textures")->capture_default_str();
       return [o] { run_clips_fixture(*o); };
     }});

}  // namespace

std::string media_path() {
  if (const char* path = std::getenv("MMTRAIN_MEDIA_PATH")) return path;
  const auto beside = fs::path(executable_dir()) / ".." / "share" / "mmtrain" / "python";
  if (fs::exists(beside / "mmtrain_media")) return fs::weakly_canonical(beside).string();
  fail("cannot find the media room: expected ", beside.string(), "/mmtrain_media (the build copies it there) or "
       "$MMTRAIN_MEDIA_PATH");
}

std::pair<int64_t, int64_t> parse_resolution(const std::string& text, int64_t multiple, const std::string& flag) {
  const auto x = text.find('x');
  char* end = nullptr;
  errno = 0;
  const long long height = x == std::string::npos ? 0 : std::strtoll(text.c_str(), &end, 10);
  const bool height_ok = x != std::string::npos && end == text.c_str() + x;
  const long long width = height_ok ? std::strtoll(text.c_str() + x + 1, &end, 10) : 0;
  if (!height_ok || *end != '\0' || errno != 0 || height <= 0 || width <= 0 || height > 16384 || width > 16384)
    fail(flag, " '", text, "': expected HxW, two positive integers up to 16384 (e.g. 256x480)");
  if (height % multiple != 0 || width % multiple != 0)
    fail(flag, " ", text, ": both sides must be multiples of ", multiple,
         multiple == kPixelsPerToken ? " (the VAE's 16x16 stride times the 2x2 patch)" : "");
  return {height, width};
}

void exec_media_module(const std::string& module, const std::vector<std::string>& args) {
  const std::string path = media_path();
  const char* existing = std::getenv("PYTHONPATH");
  const std::string python_path = existing && *existing ? path + ":" + existing : path;
  ::setenv("PYTHONPATH", python_path.c_str(), 1);
  const std::string python = tools_python();
  std::vector<std::string> argv = {python, "-m", "mmtrain_media." + module};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> pointers;
  for (auto& arg : argv) pointers.push_back(arg.data());
  pointers.push_back(nullptr);
  std::fflush(nullptr);
  ::execvp(pointers[0], pointers.data());
  fail("cannot run the media room's Python '", python, "': ", std::strerror(errno),
       " (set $MMTRAIN_PYTHON to a Python with diffusers, transformers and av: scripts/setup.sh installs them in .venv)");
}

void add_prepare_commands(CLI::App& app, Commands& commands) {
  auto* prepare = app.add_subcommand("prepare", "encode raw media into a model's training data");
  prepare->require_subcommand(1);
  auto* cmd = prepare->add_subcommand(
      "magihuman", "clips (video, sound, caption) -> the magihuman_precomputed layout, or back with --decode");
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
  commands.add(cmd, [o] { run_prepare(*o); });
}

}  // namespace mmtrain
