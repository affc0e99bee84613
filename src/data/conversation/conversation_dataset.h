// dataset_type "huggingface" (the seed's name): LLaVA-Instruct / sharegpt style image-text
// conversations for the SFT of any vision-language model. The chat format is chosen by name
// (basic_parameters.template, data/chat/chat_template.h), the image processor by the model's spec
// (VisionInputs, data/image/image_processor.h); nothing here knows one model.
//
// Input: basic_parameters.dataset is a JSON list or a JSONL file of records, each either
//   {"conversations": [{"from": "human"|"gpt"|"system", "value": "..."}...], "image": "a.jpg"}
// (LLaVA-Instruct; "images": [...] also accepted) or
//   {"messages": [{"role": "user"|"assistant"|"system", "content": "..."}...], "images": [...]}
// (LLaMA-Factory's mllm_demo). Image paths are relative to basic_parameters.dataset_dir unless
// absolute. Each "<image>" in a user message is one image of the record, in order.
//
// The constructor reads every record once and keeps the usable ones; the rest are dropped and
// counted by reason (summary()): malformed record, no assistant turn, roles that do not alternate
// user/assistant after an optional first system message, "<image>" count != images, image file
// missing or unreadable (header check), image tokens cut by truncation, nothing supervised left.
// get(i) encodes sample i again (chat template, cutoff_len truncation, image expansion) and
// decodes its images, so memory holds conversations, not tokens or pixels. A file whose header
// reads but whose pixels do not decode (a PNG chunk failing its CRC, a truncated JPEG) is found
// only there: its sample is skipped, with a warning naming the file and the count so far
// (skipped()); item i then takes the next sample that decodes (i + 1, i + 2, ...), a packed row
// simply loses that sample. The choice depends only on the files, so every run and every resume
// sees the same items.
//
// packing: true turns the samples into bins of at most cutoff_len tokens (LLaMA-Factory's
// greedy_knapsack over the sample lengths); an item is then a whole bin with position_ids
// restarting per sample and cu_seqlens.
//
// One item (a Batch): input_ids, labels int64 [S]; pixel_values float32 [N, 3, H_max, W_max]
// (zero-padded bottom/right) and image_sizes int64 [N, 2] when the item has images; packed items
// add position_ids int64 [S] and cu_seqlens int64 [k + 1].
#pragma once
#include "data/chat/chat_template.h"
#include "data/conversation/image_token_check.h"
#include "data/dataset.h"
#include "data/image/image_decode.h"
#include "data/image/image_processor.h"

#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace mmtrain::conversation {

struct ConversationDataOptions {
  std::string dataset_file;    // basic_parameters.dataset
  std::string dataset_dir;     // basic_parameters.dataset_dir: root of relative image paths
  std::string tokenizer_path;  // preprocess_parameters.model_name_or_path (default model.model_name_or_path)
  std::string chat_template = "mistral";  // basic_parameters.template (data/chat/chat_template.h)
  std::string default_system;  // basic_parameters.default_system
  int64_t cutoff_len = 2048;   // basic_parameters.cutoff_len; <= 0: no truncation
  int64_t max_samples = 0;     // basic_parameters.max_samples: first N records; 0 = all
  bool packing = false;        // basic_parameters.packing
  tokenizer::TextTokenizerOptions tokenizer;  // preprocess_parameters.{fix_mistral_regex, split_special_tokens}
  // From the model spec's VisionInputs and the processor's preprocess_parameters.
  std::shared_ptr<const image::ImageProcessor> images;
  int64_t max_image_pixels = image::kDefaultMaxImagePixels;  // preprocess_parameters.max_image_pixels
  // Prompts for generation (`mmtrain sample`), not training samples: a record's final assistant
  // message, if any, is dropped; an item's input_ids are the conversation up to where the answer
  // starts (labels all -100), never truncated (a prompt over cutoff_len is dropped); packing is off.
  // An image that does not decode is an error, not a skip to the next prompt.
  bool generation = false;
  // Preference pairs (data/conversation/preference_dataset.h): only the last turn's answer is
  // supervised (earlier answers are part of the prompt), and nothing is truncated: a sequence
  // longer than cutoff_len is dropped.
  bool last_answer_only = false;

  static ConversationDataOptions from_config(const DataConfig& data, const ModelConfig& model);
};

class ConversationDataset : public Dataset {
 public:
  explicit ConversationDataset(const ConversationDataOptions& options);
  // Over records already read (options.dataset_file names them in messages), in the file's format.
  ConversationDataset(const ConversationDataOptions& options, std::vector<nlohmann::json> records);

  int64_t size() const override;
  Batch get(int64_t index) const override;
  std::string summary() const override;
  // input_ids of the item (image tokens included; a packed item's whole bin).
  std::optional<int64_t> sample_tokens(int64_t index) const override;

  // Per-reason counts of dropped records, and how many records were read.
  const std::map<std::string, int64_t>& dropped() const { return dropped_; }
  // Sample i's last user message (generation: what its completion answers).
  const std::string& last_user_message(int64_t index) const;
  int64_t records() const { return records_; }
  // Samples skipped so far because an image failed to decode (on this process).
  int64_t skipped() const;
  // The sample record `record` became; nothing when it was dropped.
  std::optional<int64_t> sample_of_record(int64_t record) const;
  // Sample `index` (not an item: packing is not applied) with its images decoded when with_images;
  // nothing when one of them does not decode (then counted in skipped()).
  std::optional<Batch> build(int64_t index, bool with_images = true) const;

 private:
  struct Sample {
    chat::Conversation conversation;
    std::vector<std::string> image_paths;
    std::vector<image::ImageSize> resized;  // per image, after the processor's resize
    int64_t length = 0;                     // tokens after truncation
  };
  struct Encoded {
    chat::TrainingSequence sequence;
    std::string problem;  // empty when usable
  };

  Encoded encode(const Sample& sample) const;
  void drop(const std::string& reason, const std::string& example);

  ConversationDataOptions options_;
  std::unique_ptr<const chat::ChatTemplate> template_;
  ImageTokenIds image_ids_;
  std::vector<Sample> samples_;
  std::vector<int64_t> sample_records_;     // the record each sample came from, ascending
  std::vector<std::vector<int64_t>> bins_;  // packing: sample indices per item
  int64_t records_ = 0;
  std::map<std::string, int64_t> dropped_;
  std::map<std::string, std::string> first_example_;  // reason -> first record that hit it
  mutable std::mutex undecodable_mutex_;                // get() runs on the loader's workers
  mutable std::set<int64_t> undecodable_;               // samples with an image that failed to decode
};

// The records of a JSON list or a JSONL file; a syntax error fails naming the file (and line).
std::vector<nlohmann::json> read_records(const std::string& path);
// "record 3 (id abc)" for messages about record r at `index`.
std::string record_label(const nlohmann::json& r, size_t index);

// LLaMA-Factory's greedy_knapsack: lengths sorted ascending; each bin repeatedly takes the
// longest remaining length that still fits in `capacity`. Returns indices into `lengths` per
// bin. Every length must be <= capacity.
std::vector<std::vector<int64_t>> greedy_knapsack(const std::vector<int64_t>& lengths, int64_t capacity);

}  // namespace mmtrain::conversation
