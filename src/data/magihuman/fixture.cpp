// `mmtrain fixture magihuman --out DIR`: synthetic MagiHuman precomputed samples in the
// `magihuman_precomputed` layout: DIR/{latents, audio_latents, conditions}/sample_NNNNNN.{pt,
// safetensors}. Defaults are the official 5 s 256p shape: video [3840, 192] on the grid (32, 8,
// 15), audio [126, 64], text [640, 3584], 4606 packed tokens. Clean values are i.i.d. N(0, 1)
// (unit-variance like normalised VAE latents, so a zero prediction scores E[(eps - x0)^2] = 2 per
// modality, loss 4), drawn per sample from a generator seeded by (seed, sample index): video,
// then audio, then text. --mix gives each sample its own duration and resolution (sample_shape).
// `mmtrain fixture magihuman-pairs --out DIR --pairs N` writes 2N such samples and a pairs manifest.
#include "core/cli_command.h"
#include "core/error.h"
#include "core/random.h"
#include "data/magihuman/precomputed_dataset.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

namespace mmtrain::magihuman {
namespace {

struct DataFixture {
  std::string out_dir;
  int64_t samples = 8;
  std::string video_grid = "32,8,15";  // T,H',W'
  int64_t audio_tokens = 126;
  int64_t text_tokens = 640;
  int64_t video_channels = 192;
  int64_t audio_channels = 64;
  int64_t text_channels = 3584;
  std::string format = "pt";  // pt (torch.save zip, loadable by torch.load(weights_only=True)) | safetensors
  uint64_t seed = 0;
  bool mix = false;  // each sample its own duration and resolution (sample_shape)
};

struct SampleShape {
  std::array<int64_t, 3> grid;
  int64_t audio_tokens;
};

// With --mix, sample i's clip is one of 4 durations (1/4, 1/2, 1 and 2 x the grid's T, the audio
// rows with it) at one of 3 resolutions (1/2, 1 and 3/2 x H' and W'), drawn from (seed, i): the
// video tokens span 1/16 to 4.5 x the base grid's, a 72x spread. Text rows stay. Without, the base.
SampleShape sample_shape(const DataFixture& o, const std::array<int64_t, 3>& base, at::Generator& gen) {
  if (!o.mix) return {base, o.audio_tokens};
  const int64_t choice = at::randint(0, 12, {1}, gen, at::kLong).item<int64_t>();
  const double durations[] = {0.25, 0.5, 1.0, 2.0}, scales[] = {0.5, 1.0, 1.5};
  const double d = durations[choice % 4], s = scales[choice / 4];
  auto at_least_one = [](double x) { return std::max<int64_t>(1, static_cast<int64_t>(std::llround(x))); };
  return {{at_least_one(base[0] * d), at_least_one(base[1] * s), at_least_one(base[2] * s)},
          std::max<int64_t>(0, static_cast<int64_t>(std::llround(o.audio_tokens * d)))};
}

// "T,H,W" -> {T, H, W}, all >= 1.
std::array<int64_t, 3> parse_video_grid(const std::string& text) {
  std::array<int64_t, 3> grid{};
  std::stringstream in(text);
  std::string part;
  int n = 0;
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (n >= 3 || used != part.size() || part.empty() || value < 1)
      fail("--video-grid: expected three integers >= 1 as T,H,W (e.g. 32,8,15), found '", text, "'");
    grid[n++] = value;
  }
  if (n != 3) fail("--video-grid: expected three integers >= 1 as T,H,W (e.g. 32,8,15), found '", text, "'");
  return grid;
}

void write_samples(const DataFixture& o) {
  const auto video_grid = parse_video_grid(o.video_grid);
  if (o.samples <= 0) fail("fixture magihuman: --samples must be >= 1, found ", o.samples);
  if (o.audio_tokens < 0 || o.text_tokens < 0)
    fail("fixture magihuman: --audio-tokens and --text-tokens must be >= 0, found ", o.audio_tokens, ", ", o.text_tokens);
  if (o.video_channels <= 0 || o.video_channels % 4 != 0)
    fail("fixture magihuman: --video-channels must be a positive multiple of 4 (latent channels x 1x2x2 patch), found ",
         o.video_channels);
  if (o.audio_channels <= 0 || o.text_channels <= 0)
    fail("fixture magihuman: --audio-channels and --text-channels must be >= 1, found ", o.audio_channels, ", ",
         o.text_channels);
  namespace fs = std::filesystem;
  const fs::path root(o.out_dir);
  const char* const subdirs[] = {"latents", "audio_latents", "conditions"};
  const std::string ext = "." + o.format;
  auto stem = [](int64_t i) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "sample_%06lld", static_cast<long long>(i));
    return std::string(buf);
  };
  // Files this run writes may be overwritten; any other sample file would join the data set.
  std::set<std::string> ours;
  for (int64_t i = 0; i < o.samples; ++i) ours.insert(stem(i) + ext);
  for (const char* sub : subdirs) {
    fs::create_directories(root / sub);
    for (const auto& entry : fs::directory_iterator(root / sub)) {
      const auto p = entry.path();
      if ((p.extension() == ".pt" || p.extension() == ".safetensors") && !ours.count(p.filename().string()))
        fail("fixture magihuman: ", p.string(), " is not a file this fixture writes (", o.samples, " samples, --format ",
             o.format, "): use an empty --out directory");
    }
  }
  for (int64_t i = 0; i < o.samples; ++i) {
    auto gen = indexed_generator(o.seed, static_cast<uint64_t>(i));
    const SampleShape shape = sample_shape(o, video_grid, gen);
    const int64_t nv = shape.grid[0] * shape.grid[1] * shape.grid[2];
    const auto video = at::randn({nv, o.video_channels}, gen, at::kFloat);
    const auto audio = at::randn({shape.audio_tokens, o.audio_channels}, gen, at::kFloat);
    const auto text = at::randn({o.text_tokens, o.text_channels}, gen, at::kFloat);
    const auto grid = at::tensor(std::vector<int64_t>(shape.grid.begin(), shape.grid.end()), at::kLong);
    const std::vector<std::vector<std::pair<std::string, at::Tensor>>> files = {
        {{"video_latent", video}, {"video_grid_thw", grid}}, {{"audio_latent", audio}}, {{"prompt_embeds", text}}};
    for (int k = 0; k < 3; ++k) {
      const auto path = (root / subdirs[k] / (stem(i) + ext)).string();
      if (o.format == "pt")
        write_pt_file(path, files[k]);
      else
        safetensors_write(path, files[k], {{"generator", "mmtrain fixture magihuman"}});
    }
  }
  std::printf("wrote %lld samples to %s\n", static_cast<long long>(o.samples), o.out_dir.c_str());
}

// `fixture magihuman-pairs`: 2N samples of one shape and DIR/pairs.jsonl pairing sample 2k
// (chosen) with sample 2k+1 (rejected), the dataset magihuman_preference's manifest.
void write_pairs(DataFixture o, int64_t pairs) {
  if (pairs <= 0) fail("fixture magihuman-pairs: --pairs must be >= 1, found ", pairs);
  o.samples = 2 * pairs;
  write_samples(o);
  std::string manifest;
  for (int64_t k = 0; k < pairs; ++k) {
    char line[96];
    std::snprintf(line, sizeof(line), "{\"chosen\": \"sample_%06lld\", \"rejected\": \"sample_%06lld\"}\n",
                  static_cast<long long>(2 * k), static_cast<long long>(2 * k + 1));
    manifest += line;
  }
  const auto path = (std::filesystem::path(o.out_dir) / "pairs.jsonl").string();
  file_write_atomic(path, manifest);
  std::printf("wrote %lld pairs to %s\n", static_cast<long long>(pairs), path.c_str());
}

// The options both fixtures share: the clips' shapes, seed and format.
void add_clip_options(CLI::App& cmd, DataFixture& o) {
  cmd.add_option("--out", o.out_dir, "output .precomputed directory")->required();
  cmd.add_option("--seed", o.seed, "random seed of the clean latents")->capture_default_str();
  cmd.add_option("--video-grid", o.video_grid, "video token grid T,H',W'")->capture_default_str();
  cmd.add_option("--audio-tokens", o.audio_tokens, "audio latent rows")->capture_default_str();
  cmd.add_option("--text-tokens", o.text_tokens, "text embedding rows")->capture_default_str();
  cmd.add_option("--video-channels", o.video_channels, "video token width (latent channels x 4)")
      ->capture_default_str();
  cmd.add_option("--audio-channels", o.audio_channels, "audio latent width")->capture_default_str();
  cmd.add_option("--text-channels", o.text_channels, "text embedding width")->capture_default_str();
  cmd.add_option("--format", o.format, "pt (torch.save) or safetensors")
      ->check(CLI::IsMember({"pt", "safetensors"}))
      ->capture_default_str();
}

const CliRegistration fixture(fixture_registry(),
    "magihuman", {"MagiHuman precomputed samples: DIR/{latents,audio_latents,conditions}/ (dataset magihuman_precomputed)",
                  [](CLI::App& cmd) {
                    auto o = std::make_shared<DataFixture>();
                    add_clip_options(cmd, *o);
                    cmd.add_option("--samples", o->samples, "number of samples")->capture_default_str();
                    cmd.add_flag("--mix", o->mix,
                                 "each sample one of 4 durations (1/4 to 2 x T, audio with it) at one of 3 "
                                 "resolutions (1/2 to 3/2 x H', W'): a 72x spread of video tokens");
                    return [o] { write_samples(*o); };
                  }});

const CliRegistration pairs_fixture(fixture_registry(),
    "magihuman-pairs", {"MagiHuman preference pairs: 2N samples of one shape and DIR/pairs.jsonl (dataset "
                        "magihuman_preference)",
                        [](CLI::App& cmd) {
                          auto o = std::make_shared<DataFixture>();
                          auto pairs = std::make_shared<int64_t>(4);
                          add_clip_options(cmd, *o);
                          cmd.add_option("--pairs", *pairs, "number of pairs")->capture_default_str();
                          return [o, pairs] { write_pairs(*o, *pairs); };
                        }});

}  // namespace
}  // namespace mmtrain::magihuman
