// The samples a training run makes (train/training_sampler.h; training.sample_interval,
// sample_prompts, sample_at_start), registered by model: MagiHuman's clips as latents, Magistral's
// completions, with the settings of `mmtrain sample` and its prompts files (docs/sampling.md).
#include "config/config.h"
#include "core/error.h"
#include "models/magihuman/config.h"
#include "sample/magihuman_prompts.h"
#include "sample/mistral3_prompts.h"
#include "train/run.h"
#include "train/training_sampler.h"

#include <memory>

namespace mmtrain::sample {

namespace {

// MagiHuman: the prompts must be precomputed embeddings ("conditions"): the 9B text encoder is
// not loaded beside a training run. A line's negative_conditions gives it guidance.
class MagiHumanTrainingSampler : public TrainingSampler {
 public:
  explicit MagiHumanTrainingSampler(Run& run) {
    const auto& path = run.config.training.sample_prompts;
    prompts_ = read_magihuman_prompts(path, run.config.training.seed, MagiHumanSampleSettings{});
    const int64_t text = magihuman::MagiHumanConfig::from_json(run.config.model.config).text_in_channels;
    for (auto& p : prompts_) {
      if (!p.text.empty())
        fail("training.sample_prompts ", path, ": a text prompt (\"", p.text.substr(0, 40), "\"): training samples need ",
             "precomputed 'conditions' (the conditions/ files of `mmtrain prepare magihuman`); the text encoder is not ",
             "loaded beside a training run");
      p.embedding = read_text_embedding(p.conditions, text);
      if (!p.negative_conditions.empty()) p.negative = read_text_embedding(p.negative_conditions, text);
    }
  }
  void sample(Run& run, const std::string& out_dir) override {
    sample_magihuman_prompts(run, prompts_, out_dir, "training");
  }

 private:
  std::vector<MagiHumanPrompt> prompts_;
};

// Magistral: greedy completions of 128 tokens at most.
class Mistral3TrainingSampler : public TrainingSampler {
 public:
  explicit Mistral3TrainingSampler(Run& run)
      : prompts_(read_mistral3_prompts(run.config, run.config.training.sample_prompts, "")) {
    sampling_.max_new_tokens = 128;
  }
  void sample(Run& run, const std::string& out_dir) override {
    generate_completions(run, prompts_, sampling_, run.config.training.seed, /*save_logits=*/false, out_dir);
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
