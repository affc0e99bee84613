#include "tools/fixture.h"

#include "checkpoint/safetensors.h"
#include "core/config.h"
#include "core/error.h"
#include "data/magihuman/precomputed_dataset.h"
#include "models/magihuman/config.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>

namespace mmtrain {

void fixture_tokens(const std::string& out_path, int64_t samples, int64_t seq_len, int64_t vocab, uint64_t seed,
                    bool learnable) {
  if (samples <= 0 || seq_len < 2 || vocab <= 0)
    fail("fixture tokens: need samples > 0, seq_len >= 2, vocab > 0; got ", samples, ", ", seq_len, ", ", vocab);
  auto parent = std::filesystem::path(out_path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(0, vocab, {samples, seq_len}, gen, at::kLong);
  if (learnable) {
    // x[t+1] = (5 x[t] + 3) mod vocab, except where a 10 % noise mask keeps the random token:
    // a model can learn it, so a falling loss means training works.
    auto keep_random = at::rand({samples, seq_len}, gen) < 0.1;
    for (int64_t t = 1; t < seq_len; ++t) {
      auto next = (tokens.select(1, t - 1) * 5 + 3).remainder(vocab);
      tokens.select(1, t).copy_(at::where(keep_random.select(1, t), tokens.select(1, t), next));
    }
  }
  safetensors_write(out_path, {{"tokens", tokens}}, {{"generator", "mmtrain fixture tokens"}});
}

namespace {

// splitmix64 of (seed, index): an independent generator per sample / tensor.
at::Generator indexed_generator(uint64_t seed, uint64_t index) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return at::make_generator<at::CPUGeneratorImpl>(z ^ (z >> 31));
}

std::string five_digits(int64_t i) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%05lld", static_cast<long long>(i));
  return buf;
}

}  // namespace

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

void fixture_magihuman_data(const std::string& out_dir, const MagiHumanDataFixture& o) {
  if (o.samples <= 0) fail("fixture magihuman: --samples must be >= 1, found ", o.samples);
  if (o.audio_tokens < 0 || o.text_tokens < 0)
    fail("fixture magihuman: --audio-tokens and --text-tokens must be >= 0, found ", o.audio_tokens, ", ", o.text_tokens);
  if (o.video_channels <= 0 || o.video_channels % 4 != 0)
    fail("fixture magihuman: --video-channels must be a positive multiple of 4 (latent channels x 1x2x2 patch), found ",
         o.video_channels);
  if (o.audio_channels <= 0 || o.text_channels <= 0)
    fail("fixture magihuman: --audio-channels and --text-channels must be >= 1, found ", o.audio_channels, ", ",
         o.text_channels);
  for (int i = 0; i < 3; ++i)
    if (o.video_grid[i] < 1) fail("fixture magihuman: --video-grid entries must be >= 1");
  if (o.format != "pt" && o.format != "safetensors")
    fail("fixture magihuman: --format must be pt or safetensors, found '", o.format, "'");
  namespace fs = std::filesystem;
  const fs::path root(out_dir);
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
  const int64_t nv = o.video_grid[0] * o.video_grid[1] * o.video_grid[2];
  for (int64_t i = 0; i < o.samples; ++i) {
    auto gen = indexed_generator(o.seed, static_cast<uint64_t>(i));
    const auto video = at::randn({nv, o.video_channels}, gen, at::kFloat);
    const auto audio = at::randn({o.audio_tokens, o.audio_channels}, gen, at::kFloat);
    const auto text = at::randn({o.text_tokens, o.text_channels}, gen, at::kFloat);
    const auto grid = at::tensor(std::vector<int64_t>(o.video_grid.begin(), o.video_grid.end()), at::kLong);
    const std::vector<std::vector<std::pair<std::string, at::Tensor>>> files = {
        {{"video_latent", video}, {"video_grid_thw", grid}}, {{"audio_latent", audio}}, {{"prompt_embeds", text}}};
    for (int k = 0; k < 3; ++k) {
      const auto path = (root / subdirs[k] / (stem(i) + ext)).string();
      if (o.format == "pt")
        magihuman::write_pt_file(path, files[k]);
      else
        safetensors_write(path, files[k], {{"generator", "mmtrain fixture magihuman"}});
    }
  }
}

void fixture_magihuman_weights(const std::string& config_path, const std::string& out_dir, int64_t shards,
                               uint64_t seed) {
  const auto config = config_load(config_path);
  if (config.model.model_id != "magihuman")
    fail("fixture magihuman-weights: config ", config_path, ": model.model_id must be magihuman, found '",
         config.model.model_id, "'");
  const auto model = magihuman::MagiHumanConfig::from_json(config.model.config);
  const auto specs = magihuman::hf_tensor_specs(model);
  const int64_t n = static_cast<int64_t>(specs.size());
  const int64_t k = shards > 0 ? shards : std::min<int64_t>(7, n);
  if (shards < 0 || k > n)
    fail("fixture magihuman-weights: --shards must be in 1..", n, " (one tensor per shard at least), found ", shards);

  std::vector<int64_t> bytes(n);
  int64_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    int64_t numel = 1;
    for (int64_t d : specs[i].shape) numel *= d;
    bytes[i] = numel * static_cast<int64_t>(c10::elementSize(specs[i].disk_dtype));
    total += bytes[i];
  }
  // Shard of tensor i: the cumulative-bytes midpoint scaled to K, kept monotonic, never skipping
  // a shard and leaving enough tensors for the shards after it, so all K shards are non-empty.
  std::vector<int64_t> shard_of(n);
  int64_t before = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double mid = static_cast<double>(before) + bytes[i] / 2.0;
    int64_t s = static_cast<int64_t>(mid * k / std::max<double>(static_cast<double>(total), 1.0));
    const int64_t prev = i == 0 ? 0 : shard_of[i - 1];
    s = std::clamp<int64_t>(s, prev, std::min(prev + 1, k - 1));
    if (i == 0) s = 0;
    s = std::max(s, k - (n - i));  // tensors i..n-1 must still cover shards s..k-1
    shard_of[i] = s;
    before += bytes[i];
  }

  std::filesystem::create_directories(out_dir);
  std::vector<std::pair<std::string, std::string>> weight_map;
  int64_t i = 0;
  for (int64_t shard = 0; shard < k; ++shard) {
    const std::string file = "model-" + five_digits(shard + 1) + "-of-" + five_digits(k) + ".safetensors";
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (; i < n && shard_of[i] == shard; ++i) {
      const auto& spec = specs[i];
      auto gen = indexed_generator(seed, static_cast<uint64_t>(i));
      at::Tensor t;
      if (spec.name == "adapter.rope.bands") {
        // Upstream freq_bands: 1 / (10000 ** (arange(0, b).float() / b)), in fp32.
        const int64_t b = spec.shape.at(0);
        t = at::reciprocal(at::pow(10000, at::arange(0, b, at::kLong).to(at::kFloat) / b));
      } else {
        // N(0, 0.02) drawn in fp32 row blocks of <= 16M values, so a 1.6 GB up_gate_proj never
        // exists in fp32 at once.
        t = at::empty(spec.shape, spec.disk_dtype);
        const int64_t rows = spec.shape.empty() ? 1 : spec.shape[0];
        const int64_t cols = rows == 0 ? 0 : t.numel() / rows;
        auto flat = t.view({rows, cols});
        const int64_t block = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(cols, 1));
        for (int64_t r = 0; r < rows; r += block) {
          const int64_t m = std::min(block, rows - r);
          flat.narrow(0, r, m).copy_(at::randn({m, cols}, gen, at::kFloat) * 0.02);
        }
      }
      tensors.emplace_back(spec.name, t.to(spec.disk_dtype).contiguous());
      weight_map.emplace_back(spec.name, file);
    }
    safetensors_write((std::filesystem::path(out_dir) / file).string(), tensors, {{"format", "pt"}});
  }
  std::sort(weight_map.begin(), weight_map.end());  // as HF save_pretrained writes its index
  nlohmann::ordered_json metadata = {{"total_size", total}};
  safetensors_index_write((std::filesystem::path(out_dir) / "model.safetensors.index.json").string(), metadata,
                          weight_map);
}

}  // namespace mmtrain
