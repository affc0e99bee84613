#include "data/conversation/preference_dataset.h"

#include "core/error.h"
#include "core/text.h"

#include <sstream>
#include <variant>

namespace mmtrain::conversation {

namespace {

constexpr const char* kDatasetType = "preference";

// A TRL message's content as the conversation data's text: a string as it is, a list of parts
// joined in order with each image part written "<image>". Nothing when it is neither.
std::optional<std::string> content_text(const nlohmann::json& content) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) return std::nullopt;
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("type") || !part.at("type").is_string()) return std::nullopt;
    const auto type = part.at("type").get<std::string>();
    if (type == "image") {
      text += chat::kImagePlaceholder;
    } else if (type == "text" && part.contains("text") && part.at("text").is_string()) {
      text += part.at("text").get<std::string>();
    } else {
      return std::nullopt;
    }
  }
  return text;
}

// TRL messages -> the conversation data's {"role", "content": text}; nothing when one is malformed.
std::optional<nlohmann::json> messages_of(const nlohmann::json& list) {
  if (!list.is_array()) return std::nullopt;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& m : list) {
    if (!m.is_object() || !m.contains("role") || !m.at("role").is_string() || !m.contains("content"))
      return std::nullopt;
    const auto text = content_text(m.at("content"));
    if (!text) return std::nullopt;
    out.push_back({{"role", m.at("role")}, {"content", *text}});
  }
  return out;
}

bool blank(const std::string& text) { return text.find_first_not_of(" \t\r\n") == std::string::npos; }

// A TRL record -> its chosen and rejected conversations (the conversation data's records), or why not.
struct Conversations {
  nlohmann::json chosen, rejected;
};
std::variant<Conversations, std::string> parse_pair(const nlohmann::json& r) {
  if (!r.is_object()) return std::string("malformed record (not a JSON object)");
  if (!r.contains("chosen") || !r.contains("rejected"))
    return std::string("malformed record (no \"chosen\" and \"rejected\" messages)");
  auto chosen = messages_of(r.at("chosen")), rejected = messages_of(r.at("rejected"));
  if (!chosen || !rejected) return std::string("malformed record (a message without a string role and content)");
  nlohmann::json prompt = nlohmann::json::array();
  if (r.contains("prompt")) {
    auto given = messages_of(r.at("prompt"));
    if (!given) return std::string("malformed record (a prompt message without a string role and content)");
    prompt = std::move(*given);
  } else {  // TRL's implicit prompt: the messages both conversations begin with
    size_t common = 0;
    while (common < chosen->size() && common < rejected->size() && (*chosen)[common] == (*rejected)[common]) ++common;
    for (size_t i = 0; i < common; ++i) prompt.push_back((*chosen)[i]);
    chosen->erase(chosen->begin(), chosen->begin() + static_cast<std::ptrdiff_t>(common));
    rejected->erase(rejected->begin(), rejected->begin() + static_cast<std::ptrdiff_t>(common));
  }
  for (const auto* answer : {&*chosen, &*rejected})
    if (answer->size() != 1 || (*answer)[0].at("role") != "assistant")
      return std::string("answer is not one assistant message");
  const auto chosen_text = (*chosen)[0].at("content").get<std::string>();
  const auto rejected_text = (*rejected)[0].at("content").get<std::string>();
  if (blank(chosen_text) || blank(rejected_text)) return std::string("empty answer");
  if (chosen_text == rejected_text) return std::string("identical answers");
  nlohmann::json images = nlohmann::json::array();
  for (const char* key : {"image", "images"})
    if (r.contains(key) && !r.at(key).is_null()) images = r.at(key).is_array() ? r.at(key) : nlohmann::json::array({r.at(key)});
  auto conversation = [&](const nlohmann::json& answer) {
    nlohmann::json messages = prompt;
    messages.push_back(answer[0]);
    return nlohmann::json{{"messages", messages}, {"images", images}};
  };
  return Conversations{conversation(*chosen), conversation(*rejected)};
}

}  // namespace

PreferenceDataset::PreferenceDataset(ConversationDataOptions options) : options_(std::move(options)) {
  if (options_.packing)
    fail("dataset ", kDatasetType, ": basic_parameters.packing is not supported (the two sequences of a pair go "
         "through the model as rows of one micro-batch)");
  options_.last_answer_only = true;
  auto records = read_records(options_.dataset_file);
  if (options_.max_samples > 0 && static_cast<int64_t>(records.size()) > options_.max_samples)
    records.resize(static_cast<size_t>(options_.max_samples));
  records_ = static_cast<int64_t>(records.size());
  std::vector<nlohmann::json> sequences;  // 2k: pair k's chosen, 2k + 1: its rejected
  std::vector<std::string> labels;        // pair k's record
  for (size_t i = 0; i < records.size(); ++i) {
    const std::string label = record_label(records[i], i);
    auto parsed = parse_pair(records[i]);
    if (const auto* reason = std::get_if<std::string>(&parsed)) {
      ++dropped_[*reason];
      first_example_.emplace(*reason, label);
      continue;
    }
    auto& pair = std::get<Conversations>(parsed);
    sequences.push_back(std::move(pair.chosen));
    sequences.push_back(std::move(pair.rejected));
    labels.push_back(label);
  }
  if (sequences.empty())
    fail("dataset ", options_.dataset_file, ": none of its ", records_, " records is a usable pair (", summary(), ")");
  ConversationDataOptions sequence_options = options_;
  sequence_options.max_samples = 0;
  sequences_ = std::make_unique<ConversationDataset>(sequence_options, std::move(sequences));
  for (size_t k = 0; k < labels.size(); ++k) {
    const auto chosen = sequences_->sample_of_record(static_cast<int64_t>(2 * k));
    const auto rejected = sequences_->sample_of_record(static_cast<int64_t>(2 * k + 1));
    if (!chosen || !rejected) {
      const std::string reason = "a sequence of the pair dropped (the reasons below)";
      ++dropped_[reason];
      first_example_.emplace(reason, labels[k]);
      continue;
    }
    pairs_.push_back({*chosen, *rejected, labels[k]});
  }
  if (pairs_.empty())
    fail("dataset ", options_.dataset_file, ": none of its ", records_, " records is a usable pair (", summary(), ")");
}

Batch PreferenceDataset::get(int64_t index) const {
  if (index < 0 || index >= size()) fail("dataset ", options_.dataset_file, ": index ", index, " out of range [0, ", size(), ")");
  // Pair `index`, else the next one whose images decode (as the conversation data skips).
  for (int64_t k = 0; k < size(); ++k) {
    const Pair& pair = pairs_[static_cast<size_t>((index + k) % size())];
    auto chosen = sequences_->build(pair.chosen);
    if (!chosen) continue;
    const auto rejected = sequences_->build(pair.rejected, /*with_images=*/false);  // the same images
    Batch out = {{"chosen_input_ids", (*chosen)["input_ids"]},
                 {"chosen_labels", (*chosen)["labels"]},
                 {"rejected_input_ids", batch_get(*rejected, "input_ids")},
                 {"rejected_labels", batch_get(*rejected, "labels")}};
    for (const char* key : {"pixel_values", "image_sizes"})
      if (chosen->count(key)) out[key] = (*chosen)[key];
    return out;
  }
  fail("dataset ", options_.dataset_file, ": no pair decodes any more: every one has an image that failed (",
       sequences_->skipped(), " skipped; the first warnings name the files)");
}

std::string PreferenceDataset::describe(int64_t index) const {
  if (index < 0 || index >= size()) return "pair " + std::to_string(index);
  return options_.dataset_file + " " + pairs_[static_cast<size_t>(index)].label;
}

std::optional<int64_t> PreferenceDataset::sample_tokens(int64_t index) const {
  if (index < 0 || index >= size()) fail("dataset ", options_.dataset_file, ": index ", index, " out of range [0, ", size(), ")");
  const Pair& pair = pairs_[static_cast<size_t>(index)];
  return *sequences_->sample_tokens(pair.chosen) + *sequences_->sample_tokens(pair.rejected);
}

std::string PreferenceDataset::summary() const {
  int64_t dropped = 0;
  for (const auto& [reason, count] : dropped_) dropped += count;
  std::ostringstream s;
  s << "dataset " << kDatasetType << " " << options_.dataset_file << ": " << records_ << " records, " << pairs_.size()
    << " pairs kept, " << dropped << " dropped";
  for (const auto& [reason, count] : dropped_) s << "; " << count << " " << reason << " (first: " << first_example_.at(reason) << ")";
  if (sequences_) {  // the pairs' sequences the conversation data dropped, by its reasons
    int64_t dropped_sequences = 0;
    for (const auto& [reason, count] : sequences_->dropped()) dropped_sequences += count;
    s << "; of their " << sequences_->records() << " sequences (chosen and rejected) " << dropped_sequences << " dropped";
    for (const auto& [reason, count] : sequences_->dropped()) s << "; " << count << " " << reason;
  }
  return s.str();
}

namespace {

const DatasetRegistration dataset(kDatasetType, [](const DataConfig& data, const ModelConfig& model) {
  return std::make_shared<PreferenceDataset>(ConversationDataOptions::from_config(data, model));
});

}  // namespace

}  // namespace mmtrain::conversation
