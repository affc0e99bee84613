// The samples a training run makes (train/training_sampler.h; training.sample_interval,
// sample_prompts, sample_at_start), registered by model: MagiHuman's clips as latents, Magistral's
// completions, with the settings of `mmtrain sample` and its prompts files (docs/sampling.md).
// Beside each, the forwards it runs, which the plan prices (plan/sampling_plan.h).
#include "cli/python_runner.h"
#include "cli/tool_run.h"
#include "config/config.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/regular_file.h"
#include "core/text.h"
#include "io/user_file.h"
#include "models/magihuman/config.h"
#include "models/mistral3/config.h"
#include "plan/sampling_plan.h"
#include "sample/magihuman_prompts.h"
#include "sample/mistral3_prompts.h"
#include "train/run.h"
#include "train/training_sampler.h"

#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>

namespace mmtrain::sample {

namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxPreviewBytes = int64_t{256} << 20;

uint32_t big_endian32(const std::string& bytes, size_t at) {
  return (uint32_t(uint8_t(bytes[at])) << 24) | (uint32_t(uint8_t(bytes[at + 1])) << 16) |
         (uint32_t(uint8_t(bytes[at + 2])) << 8) | uint32_t(uint8_t(bytes[at + 3]));
}

template <typename T>
T little_endian(const std::string& bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

// The decoder's previews of a sample (python/mmtrain_py/media/decode.py --previews): its frame grid
// (PNG: the size is the IHDR's) and its sound (a canonical 44-byte-header PCM WAV).
void add_previews(const std::string& stem_path, const std::string& tag, SampleRecord& record) {
  SampleRecord::Image image{tag, read_user_file(stem_path + ".grid.png", "a sample's frame grid", kMaxPreviewBytes)};
  if (image.png.size() < 24 || image.png.compare(1, 3, "PNG") != 0) fail(stem_path, ".grid.png: not a PNG");
  image.width = big_endian32(image.png, 16);
  image.height = big_endian32(image.png, 20);
  record.images.push_back(std::move(image));
  SampleRecord::Audio audio{tag, read_user_file(stem_path + ".wav", "a sample's sound", kMaxPreviewBytes)};
  if (audio.wav.size() < 44 || audio.wav.compare(0, 4, "RIFF") != 0) fail(stem_path, ".wav: not a WAV file");
  audio.channels = little_endian<uint16_t>(audio.wav, 22);
  audio.sample_rate = little_endian<uint32_t>(audio.wav, 24);
  audio.frames = audio.channels > 0 ? little_endian<uint32_t>(audio.wav, 40) / (2 * audio.channels) : 0;
  record.audio.push_back(std::move(audio));
}

// MagiHuman: the prompts must be precomputed embeddings ("conditions"): the 9B text encoder is
// not loaded beside a training run. A line's negative_conditions gives it guidance.
class MagiHumanTrainingSampler : public TrainingSampler {
 public:
  explicit MagiHumanTrainingSampler(Run& run) {
    const auto& path = run.config.training.sample_prompts;
    prompts_ = read_magihuman_prompts(path, run.config.training.seed, MagiHumanSampleSettings{});
    const int64_t text = magihuman::MagiHumanConfig::from_json(run.config.model.config).text_in_channels;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const auto& p = prompts_[i];
      if (!p.text.empty())
        fail("training.sample_prompts ", path, ": a text prompt (\"", p.text.substr(0, 40), "\"): training samples need ",
             "precomputed 'conditions' (the conditions/ files of `mmtrain prepare magihuman`); the text encoder is not ",
             "loaded beside a training run");
      // No default shape: 5 s at 256x480 would say nothing of a run training on other clips.
      if (!p.sized)
        fail("training.sample_prompts ", path, ": line ", i + 1, " gives no 'seconds' and 'resolution'; a training ",
             "sample's shape is given per line (e.g. the shape of the clips the run trains on)");
    }
    read_magihuman_embeddings(prompts_, text, std::nullopt);
    // The decoders are loaded only when the first samples are decoded: their directories are checked now.
    const auto& t = run.config.training;
    for (const auto& [key, dir] : {std::pair{"training.sample_vae", t.sample_vae}, {"training.sample_audio_vae", t.sample_audio_vae}})
      if (!dir.empty()) require_regular_file((fs::path(dir) / "config.json").string(), std::string(key) + " " + dir,
                                             "a diffusers model directory with its config.json");
  }
  SampleRecord sample(Run& run, const std::string& out_dir) override {
    sample_magihuman_prompts(run, prompts_, out_dir, "training");
    SampleRecord record;
    const auto& t = run.config.training;
    if (t.sample_vae.empty()) return record;  // latents only
    on_rank0_while_others_wait(run, "training samples: decoding", [&] {
      const bool cuda = run.comm().device().is_cuda();
      run_python_module("media.decode", {"--beside", "--previews", "--input", out_dir, "--out", out_dir, "--vae", t.sample_vae,
                                  "--audio-vae", t.sample_audio_vae, "--device", cuda ? "cuda" : "cpu", "--dtype",
                                  cuda ? "bf16" : "fp32", "--fps", "25"},
                       (fs::path(out_dir) / ".decode.log").string(), "decoding the training samples");
    });
    if (!run.is_rank0()) return record;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const std::string stem = format("%04zu", i);
      add_previews((fs::path(out_dir) / stem).string(), "samples/" + stem, record);
    }
    return record;
  }

 private:
  std::vector<MagiHumanPrompt> prompts_;
};

// Magistral: greedy completions of kTrainingNewTokens tokens at most.
constexpr int64_t kTrainingNewTokens = 128;

class Mistral3TrainingSampler : public TrainingSampler {
 public:
  explicit Mistral3TrainingSampler(Run& run)
      : prompts_(read_mistral3_prompts(run.config, run.config.training.sample_prompts, "")) {
    if (!run.config.training.sample_vae.empty())
      fail("training.sample_vae: a MagiHuman key (its video decoder); a mistral3 run samples text");
    refuse_context_parallel_generation(run.config, "training.sample_prompts");
    sampling_.max_new_tokens = kTrainingNewTokens;
  }
  // Each completion as TensorBoard text: the question, then the answer.
  SampleRecord sample(Run& run, const std::string& out_dir) override {
    generate_completions(run, prompts_, sampling_, run.config.training.seed, /*save_logits=*/false, out_dir);
    SampleRecord record;
    if (!run.is_rank0()) return record;
    const std::string path = (fs::path(out_dir) / "completions.jsonl").string();
    std::istringstream lines(read_user_file(path, "the completions", kMaxPreviewBytes));
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      const auto j = json_parse_checked(line, path);
      record.texts.push_back({format("samples/completion_%04lld", static_cast<long long>(j.at("index").get<int64_t>())),
                              "**" + j.at("prompt").get<std::string>() + "**\n\n" + j.at("completion").get<std::string>()});
    }
    return record;
  }

 private:
  Mistral3Prompts prompts_;
  TokenSampling sampling_;
};

// The forwards of MagiHuman's training samples: per prompt `steps` forwards over its video tokens,
// audio rows and text rows, and as many over the negative's with guidance. Prompt i runs on
// data-parallel rank i % dp; a round of prompts takes as long as its longest.
SamplingWork magihuman_sampling_work(const Config& config, const ParallelDims& dims) {
  auto prompts = read_magihuman_prompts(config.training.sample_prompts, config.training.seed, MagiHumanSampleSettings{});
  const auto model = magihuman::MagiHumanConfig::from_json(config.model.config);
  for (auto& p : prompts)
    if (!p.text.empty()) p.embedding = at::empty({kMaxTextTokens, model.text_in_channels});  // embedded to 640 rows
  read_magihuman_embeddings(prompts, model.text_in_channels, std::nullopt);
  SamplingWork work;
  const int64_t dp = dims.dp(), count = static_cast<int64_t>(prompts.size());
  int64_t forwards = 0, longest = 0;
  for (int64_t round = 0; round * dp < count; ++round) {
    std::vector<SamplingForward> slowest;
    double slowest_cost = -1;
    for (int64_t i = round * dp; i < std::min(count, (round + 1) * dp); ++i) {
      const auto& p = prompts[i];
      const auto& s = p.settings;
      const auto shape = MagiHumanLatentShape::of_clip(s.seconds, s.height, s.width, model.video_in_channels,
                                                       model.audio_in_channels);
      const int64_t latent = shape.frames * (shape.height / 2) * (shape.width / 2) + shape.audio_frames;
      std::vector<SamplingForward> mine = {{s.sampling.steps, latent + p.embedding.size(0), false, {}}};
      if (p.negative) mine.push_back({s.sampling.steps, latent + p.negative->size(0), false, {}});
      double cost = 0;
      for (const auto& f : mine) cost += static_cast<double>(f.count) * static_cast<double>(f.tokens);
      if (cost > slowest_cost) slowest_cost = cost, slowest = mine;
    }
    for (const auto& f : slowest) {
      forwards += f.count;
      longest = std::max(longest, f.tokens);
      work.forwards.push_back(f);
    }
  }
  work.summary = format("%lld prompt(s) over %lld data-parallel rank(s): %lld forwards of up to %s tokens",
                        static_cast<long long>(count), static_cast<long long>(dp), static_cast<long long>(forwards),
                        with_commas(longest).c_str());
  return work;
}

// Magistral's: per prompt one forward over the prompt (its images included) and up to
// kTrainingNewTokens - 1 cached decode steps, whose keys and values stay on the device.
SamplingWork mistral3_sampling_work(const Config& config, const ParallelDims& dims) {
  const auto prompts = read_mistral3_prompts(config, config.training.sample_prompts, "");
  const auto model = mistral3::Mistral3Config::from_json(config.model.config);
  const int64_t element = static_cast<int64_t>(c10::elementSize(config.parallel.fsdp_plan.param_dtype));
  SamplingWork work;
  const int64_t dp = dims.dp(), count = prompts.records->size();
  int64_t longest = 0;
  for (int64_t round = 0; round * dp < count; ++round) {
    SamplingForward prefill{1, 0, false, {}};
    for (int64_t i = round * dp; i < std::min(count, (round + 1) * dp); ++i) {
      const Batch prompt = prompts.records->get(i);
      const int64_t tokens = prompt.at("input_ids").size(0);
      if (tokens <= prefill.tokens) continue;
      prefill.tokens = tokens;
      prefill.images.clear();
      if (prompt.count("image_sizes")) {
        const auto sizes = prompt.at("image_sizes").to(at::kLong).contiguous();
        for (int64_t k = 0; k < sizes.size(0); ++k)
          prefill.images.emplace_back(sizes[k][0].item<int64_t>(), sizes[k][1].item<int64_t>());
      }
    }
    work.forwards.push_back(prefill);
    // The decode steps attend over prefill.tokens + 1 .. + kTrainingNewTokens - 1: priced at the middle.
    work.forwards.push_back({kTrainingNewTokens - 1, prefill.tokens + kTrainingNewTokens / 2, true, {}});
    longest = std::max(longest, prefill.tokens);
  }
  work.held_device_bytes = checked_mul(checked_mul(2 * model.num_layers, model.num_kv_heads * model.head_dim, "plan"),
                                       checked_mul(longest + kTrainingNewTokens, element, "plan"), "plan: the KV cache");
  work.summary = format("%lld prompt(s) over %lld data-parallel rank(s): prompts of up to %s tokens, %lld new tokens "
                        "each (KV cache %.1f MiB)",
                        static_cast<long long>(count), static_cast<long long>(dp), with_commas(longest).c_str(),
                        static_cast<long long>(kTrainingNewTokens),
                        static_cast<double>(work.held_device_bytes) / (1024.0 * 1024.0));
  return work;
}

const StaticRegistration<SamplingWorkFn> magihuman_work(sampling_work_registry(), "magihuman", magihuman_sampling_work);
const StaticRegistration<SamplingWorkFn> mistral3_work(sampling_work_registry(), "mistral3", mistral3_sampling_work);

const StaticRegistration<TrainingSamplerFactory> magihuman(
    training_sampler_registry(), "magihuman", [](Run& run) { return std::make_unique<MagiHumanTrainingSampler>(run); });
const StaticRegistration<TrainingSamplerFactory> mistral3(
    training_sampler_registry(), "mistral3", [](Run& run) { return std::make_unique<Mistral3TrainingSampler>(run); });

}  // namespace

}  // namespace mmtrain::sample
