// The media room's fixtures, so prepare and sample run without downloads:
//   fixture magihuman-encoders --out DIR [--config YAML]   tiny random-weight encoders of the real
//       classes (python/mmtrain_py/media/fixtures.py), sized to the config's three token widths
//   fixture clips --out DIR [--count N] [--seconds S] [--size HxW]   synthetic clips with sound
#include "cli/options.h"
#include "cli/python_runner.h"
#include "config/config.h"
#include "core/cli_command.h"
#include "core/error.h"
#include "models/magihuman/config.h"

#include <CLI/CLI.hpp>

#include <filesystem>
#include <memory>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;


struct EncodersFixture {
  std::string out, config = "examples/magihuman/magihuman_tiny.yaml";
  uint64_t seed = 0;
};

// The three token widths come from the config's model (its defaults where it is silent), so the
// encoders' outputs fit the model that trains on them.
void run_encoders_fixture(const EncodersFixture& o) {
  std::error_code error;
  if (!fs::exists(o.config, error))
    fail("fixture magihuman-encoders: config ", o.config, " does not exist (the default is relative to the repository ",
         "root: run from there, or give --config)");
  const auto config = config_load(o.config);
  if (config.model.model_id != "magihuman")
    fail("fixture magihuman-encoders: ", o.config, ": model.model_id must be magihuman, found '", config.model.model_id, "'");
  const auto model = magihuman::MagiHumanConfig::from_json(config.model.config);
  require_new_path(o.out, "--out");
  exec_python_module("media.fixtures", {"encoders", "--out", o.out, "--video-channels", std::to_string(model.video_in_channels),
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
  require_new_path(o.out, "--out");
  exec_python_module("media.fixtures", {"clips", "--out", o.out, "--count", std::to_string(o.count), "--seconds",
                                 argument_number(o.seconds), "--height", std::to_string(height), "--width", std::to_string(width),
                                 "--seed", std::to_string(o.seed)});
}

const CliRegistration encoders_fixture(
    fixture_registry(), "magihuman-encoders",
    {"tiny random-weight MagiHuman encoders of the real classes (Wan2.2 VAE, Oobleck VAE, T5Gemma) sized to a config",
     [](CLI::App& cmd) {
       auto o = std::make_shared<EncodersFixture>();
       cmd.add_option("--out", o->out, "output directory (new): DIR/vae, DIR/audio_vae, DIR/text_encoder")->required();
       cmd.add_option("--config", o->config, "YAML config whose model.config sets the three channel widths")
           ->capture_default_str();
       cmd.add_option("--seed", o->seed, "random seed")->capture_default_str();
       return [o] { run_encoders_fixture(*o); };
     }});

const CliRegistration clips_fixture(
    fixture_registry(), "clips",
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
}  // namespace mmtrain
