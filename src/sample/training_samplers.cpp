// The samples a training run makes (train/training_sampler.h; training.sample_interval,
// sample_prompts, sample_at_start), registered by model: MagiHuman's clips as latents, Magistral's
// completions, with the settings of `mmtrain sample` and its prompts files (docs/sampling.md).
#include "config/config.h"
#include "core/error.h"
#include "core/text.h"
#include "core/json_read.h"
#include "io/user_file.h"
#include "media/media_room.h"
#include "models/magihuman/config.h"
#include "sample/magihuman_prompts.h"
#include "sample/mistral3_prompts.h"
#include "tools/tool_model.h"
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

// The decoder's previews of a sample (python/mmtrain_media/decode.py --previews): its frame grid
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
    for (const auto& p : prompts_)
      if (!p.text.empty())
        fail("training.sample_prompts ", path, ": a text prompt (\"", p.text.substr(0, 40), "\"): training samples need ",
             "precomputed 'conditions' (the conditions/ files of `mmtrain prepare magihuman`); the text encoder is not ",
             "loaded beside a training run");
    read_magihuman_embeddings(prompts_, text, std::nullopt);
  }
  SampleRecord sample(Run& run, const std::string& out_dir) override {
    sample_magihuman_prompts(run, prompts_, out_dir, "training");
    SampleRecord record;
    const auto& t = run.config.training;
    if (t.sample_vae.empty()) return record;  // latents only
    on_rank0_while_others_wait(run, "training samples: decoding", [&] {
      const bool cuda = run.comm().device().is_cuda();
      run_media_module("decode", {"--beside", "--previews", "--input", out_dir, "--out", out_dir, "--vae", t.sample_vae,
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

// Magistral: greedy completions of 128 tokens at most.
class Mistral3TrainingSampler : public TrainingSampler {
 public:
  explicit Mistral3TrainingSampler(Run& run)
      : prompts_(read_mistral3_prompts(run.config, run.config.training.sample_prompts, "")) {
    if (!run.config.training.sample_vae.empty())
      fail("training.sample_vae: a MagiHuman key (its video decoder); a mistral3 run samples text");
    sampling_.max_new_tokens = 128;
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

const StaticRegistration<TrainingSamplerFactory> magihuman(
    training_sampler_registry(), "magihuman", [](Run& run) { return std::make_unique<MagiHumanTrainingSampler>(run); });
const StaticRegistration<TrainingSamplerFactory> mistral3(
    training_sampler_registry(), "mistral3", [](Run& run) { return std::make_unique<Mistral3TrainingSampler>(run); });

}  // namespace

}  // namespace mmtrain::sample
