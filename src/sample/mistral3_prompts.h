// Magistral's prompts (records in the training data's own format, read by its own reader with the
// config's chat template and images) and the generation of their completions over the ranks,
// shared by `mmtrain sample mistral3` and the training's samples (training.sample_prompts).
#pragma once
#include "config/config.h"
#include "data/conversation/conversation_dataset.h"
#include "data/tokenizer/text_tokenizer.h"
#include "sample/token_generation.h"

#include <memory>
#include <string>
#include <vector>

namespace mmtrain {
struct Run;
}

namespace mmtrain::sample {

struct Mistral3Prompts {
  std::unique_ptr<conversation::ConversationDataset> records;  // generation mode: each item a prompt
  std::shared_ptr<tokenizer::TextTokenizer> tokenizer;
  int64_t eos = 0;
};

// The JSONL `path` through config.data's conversation reader (dataset_type huggingface), images
// relative to image_dir (empty: the config's dataset_dir, else the file's folder). A record the
// reader would drop, or an image that does not decode, fails the whole file, naming the reasons.
Mistral3Prompts read_mistral3_prompts(const Config& config, const std::string& path, const std::string& image_dir);

// The ids of Magistral's image tokens ([IMG], [IMG_BREAK], [IMG_END] as the tokenizer has them, and
// model.config's image_token_index): what generation may suppress (TokenSampling::suppressed), since
// an image token in an answer matches no image when the answer is trained on (GRPO's rollouts).
std::vector<int64_t> image_token_ids(const Config& config, const tokenizer::TextTokenizer& tokenizer);

// Generation splits no sequence over ranks (the KV cache is not built for context parallelism):
// fails naming parallel.ring_attention_size / ulysses_parallel_size when `config` sets them.
void refuse_context_parallel_generation(const Config& config, const std::string& who);

// Generates every prompt's completion (prompt i on data-parallel rank i % dp, its generator seeded
// with seed + i) into out_dir/completions.jsonl, in order; with save_logits also
// out_dir/logits_<i>.safetensors. Collective.
void generate_completions(Run& run, const Mistral3Prompts& prompts, const TokenSampling& sampling, uint64_t seed,
                          bool save_logits, const std::string& out_dir);

}  // namespace mmtrain::sample
