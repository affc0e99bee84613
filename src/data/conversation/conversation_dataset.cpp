#include "data/conversation/conversation_dataset.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/param_map.h"
#include "core/regular_file.h"
#include "data/image/image_decode.h"
#include "io/atomic_file.h"
#include "models/model_spec.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <variant>

namespace mmtrain::conversation {
namespace fs = std::filesystem;

namespace {

constexpr const char* kDatasetType = "huggingface";

// A record that cannot become a training sample: the reason is counted, the record skipped.
struct Rejected {
  std::string reason;
};

enum class Role { user, assistant, system };

// LLaVA / sharegpt ("conversations", from/value) or LLaMA-Factory ("messages", role/content)
// -> conversation + image paths, or why not (LLaMA-Factory's converter rules: an optional first
// system message, then user/assistant alternating, an even count).
// generation: the record is a prompt (`mmtrain sample`): a final assistant message is dropped, and
// the conversation ends with a user message whose turn has an empty answer.
std::variant<std::pair<chat::Conversation, std::vector<std::string>>, Rejected> parse_record(const nlohmann::json& r,
                                                                                           bool generation) {
  if (!r.is_object()) return Rejected{"malformed record (not a JSON object)"};
  const bool sharegpt = r.contains("conversations");
  const char* list_key = sharegpt ? "conversations" : "messages";
  const char* role_key = sharegpt ? "from" : "role";
  const char* content_key = sharegpt ? "value" : "content";
  if (!r.contains(list_key) || !r.at(list_key).is_array())
    return Rejected{"malformed record (no \"conversations\" or \"messages\" list)"};
  std::vector<std::pair<Role, std::string>> messages;
  for (const auto& m : r.at(list_key)) {
    if (!m.is_object() || !m.contains(role_key) || !m.at(role_key).is_string() || !m.contains(content_key) ||
        !m.at(content_key).is_string())
      return Rejected{"malformed record (a message without a string role and content)"};
    const auto role = m.at(role_key).get<std::string>();
    Role parsed;
    if (role == "human" || role == "user")
      parsed = Role::user;
    else if (role == "gpt" || role == "assistant")
      parsed = Role::assistant;
    else if (role == "system")
      parsed = Role::system;
    else
      return Rejected{"malformed record (unknown role \"" + role + "\")"};
    messages.emplace_back(parsed, m.at(content_key).get<std::string>());
  }
  chat::Conversation conversation;
  size_t begin = 0;
  if (!messages.empty() && messages[0].first == Role::system) {
    conversation.system = messages[0].second;
    begin = 1;
  }
  if (generation) {
    if (messages.size() > begin && messages.back().first == Role::assistant) messages.pop_back();
    if (messages.size() == begin) return Rejected{"no user message"};
    messages.emplace_back(Role::assistant, "");  // the answer the model writes
  }
  bool any_assistant = false;
  for (size_t i = begin; i < messages.size(); ++i) any_assistant = any_assistant || messages[i].first == Role::assistant;
  if (!any_assistant) return Rejected{"no assistant turn"};
  if ((messages.size() - begin) % 2 != 0) return Rejected{"roles do not alternate user/assistant"};
  for (size_t i = begin; i < messages.size(); i += 2) {
    if (messages[i].first != Role::user || messages[i + 1].first != Role::assistant)
      return Rejected{"roles do not alternate user/assistant"};
    conversation.turns.push_back({messages[i].second, messages[i + 1].second});
  }

  std::vector<std::string> images;
  for (const char* key : {"image", "images"}) {
    if (!r.contains(key) || r.at(key).is_null()) continue;
    const auto& value = r.at(key);
    if (value.is_string()) {
      images.push_back(value.get<std::string>());
    } else if (value.is_array()) {
      for (const auto& item : value) {
        if (!item.is_string()) return Rejected{"malformed record (an image entry that is not a path)"};
        images.push_back(item.get<std::string>());
      }
    } else {
      return Rejected{"malformed record (\"" + std::string(key) + "\" is neither a path nor a list)"};
    }
  }
  if (conversation.image_placeholders() != static_cast<int64_t>(images.size()))
    return Rejected{"<image> count differs from the image list"};
  return std::make_pair(std::move(conversation), std::move(images));
}


}  // namespace

std::string record_label(const nlohmann::json& r, size_t index) {
  if (r.is_object() && r.contains("id") && (r.at("id").is_string() || r.at("id").is_number()))
    return "record " + std::to_string(index) + " (id " + (r.at("id").is_string() ? r.at("id").get<std::string>() : r.at("id").dump()) + ")";
  return "record " + std::to_string(index);
}

std::vector<nlohmann::json> read_records(const std::string& path) {
  if (!fs::is_regular_file(path)) fail("data.dataset_param.basic_parameters.dataset: no file '", path, "'");
  const std::string text = file_read_text(path);
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) fail("dataset ", path, ": empty file, expected a JSON list or JSONL records");
  std::vector<nlohmann::json> records;
  if (text[first] == '[') {
    auto list = json_parse_checked(text, "dataset " + path);
    for (auto& record : list) records.push_back(std::move(record));
    return records;
  }
  std::istringstream lines(text);
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // A pretty-printed JSON object is not JSONL: say what it is rather than "line 1: not valid JSON".
    if (records.empty() && text[first] == '{' && !nlohmann::json::accept(line) && nlohmann::json::accept(text))
      fail("dataset ", path, ": one JSON object, expected a list of records (a JSON list [...] or one record per ",
           "line, JSONL)");
    records.push_back(json_parse_checked(line, "dataset " + path + " line " + std::to_string(number)));
  }
  return records;
}

ConversationDataOptions ConversationDataOptions::from_config(const DataConfig& data, const ModelConfig& model) {
  const ParamMap p(data.dataset_param, "data.dataset_param", "dataset " + data.dataset_type);
  p.check_known_keys({"dataset_type", "basic_parameters", "preprocess_parameters"});
  const auto basic = p.child("basic_parameters");
  basic.check_known_keys({"template", "dataset", "dataset_dir", "cutoff_len", "max_samples", "packing", "default_system"});
  const auto pre = p.child("preprocess_parameters");
  // The model says which image processor reads its images; the processor adds its own keys.
  const auto& spec = model_spec(model.model_id, "model.model_id");
  if (!spec.vision_inputs)
    fail("data.dataset_param.dataset_type: ", data.dataset_type, " needs a vision-language model; model.model_id '",
         model.model_id, "' takes no images");
  const VisionInputs vision = spec.vision_inputs(model.config);
  const auto& processor = image::image_processor_registry().get(vision.image_processor, "model " + model.model_id);
  std::vector<std::string> pre_keys = {"model_name_or_path", "fix_mistral_regex", "split_special_tokens",
                                       "max_image_pixels"};
  pre_keys.insert(pre_keys.end(), processor.preprocess_keys.begin(), processor.preprocess_keys.end());
  pre.check_known_keys(pre_keys);

  ConversationDataOptions o;
  o.chat_template = basic.get_string("template", o.chat_template);
  chat::chat_template_registry().get(o.chat_template, basic.where("template"));  // a known format
  o.dataset_file = basic.get_string("dataset", "");
  if (o.dataset_file.empty()) fail(basic.where("dataset"), ": required (a JSON list or JSONL file of conversations)");
  o.dataset_dir = basic.get_string("dataset_dir", fs::path(o.dataset_file).parent_path().string());
  o.default_system = basic.get_string("default_system", "");
  o.cutoff_len = basic.get_int("cutoff_len", o.cutoff_len);
  if (o.cutoff_len < 0) fail(basic.where("cutoff_len"), ": expected >= 0 (0 = no truncation), found ", o.cutoff_len);
  o.max_samples = basic.get_int("max_samples", 0);
  if (o.max_samples < 0) fail(basic.where("max_samples"), ": expected >= 0 (0 = all), found ", o.max_samples);
  o.packing = basic.get_bool("packing", false);
  if (o.packing && o.cutoff_len <= 0)
    fail(basic.where("packing"), ": packing needs a positive ", basic.where("cutoff_len"), " (the bin size)");
  o.tokenizer_path = pre.get_string("model_name_or_path", model.model_name_or_path);
  if (o.tokenizer_path.empty())
    fail(pre.where("model_name_or_path"), ": required when model.model_name_or_path is empty (the directory or "
         "file of tekken.json / tokenizer.json)");
  o.tokenizer.fix_mistral_regex = pre.get_bool("fix_mistral_regex", false);
  o.tokenizer.split_special_tokens = pre.get_bool("split_special_tokens", false);

  o.images = processor.make(vision, pre);
  o.max_image_pixels = pre.get_int("max_image_pixels", image::kDefaultMaxImagePixels);
  if (o.max_image_pixels < 1)
    fail(pre.where("max_image_pixels"), ": expected >= 1 pixel, found ", o.max_image_pixels);
  return o;
}

ConversationDataset::ConversationDataset(const ConversationDataOptions& options)
    : ConversationDataset(options, read_records(options.dataset_file)) {}

ConversationDataset::ConversationDataset(const ConversationDataOptions& options, std::vector<nlohmann::json> records)
    : options_(options) {
  auto tokenizer = tokenizer::load_text_tokenizer(options_.tokenizer_path, options_.tokenizer);
  const auto names = options_.images->token_names();
  image_ids_.image = tokenizer->special_id(names[0]);
  image_ids_.row_break = tokenizer->special_id(names[1]);
  image_ids_.end = tokenizer->special_id(names[2]);
  template_ = chat::chat_template_registry().get(options_.chat_template)(std::move(tokenizer), options_.default_system);

  if (options_.max_samples > 0 && static_cast<int64_t>(records.size()) > options_.max_samples)
    records.resize(options_.max_samples);
  records_ = static_cast<int64_t>(records.size());
  // Large sets take a while (every record is encoded and every image header read): rank 0 says
  // how far it is every few seconds.
  const char* rank = std::getenv("RANK");
  const bool report = rank == nullptr || std::string(rank) == "0";
  auto last_report = std::chrono::steady_clock::now();
  for (size_t i = 0; i < records.size(); ++i) {
    if (report && std::chrono::steady_clock::now() - last_report > std::chrono::seconds(5)) {
      last_report = std::chrono::steady_clock::now();
      std::printf("[mmtrain] dataset %s: checked %zu of %zu records\n", options_.dataset_file.c_str(), i, records.size());
      std::fflush(stdout);
    }
    const std::string label = record_label(records[i], i);
    auto parsed = parse_record(records[i], options_.generation);
    if (auto* rejected = std::get_if<Rejected>(&parsed)) {
      drop(rejected->reason, label);
      continue;
    }
    auto& [conversation, images] = std::get<0>(parsed);
    Sample sample;
    sample.conversation = std::move(conversation);
    std::string image_problem;
    for (const auto& relative : images) {
      const fs::path path = fs::path(relative).is_absolute() ? fs::path(relative) : fs::path(options_.dataset_dir) / relative;
      // Missing, a directory, a FIFO, a link to a device or an empty name: named for what it is.
      try {
        require_regular_file(path.string(), path.string(), "an image file");
      } catch (const Error& e) {
        image_problem = fs::exists(path) || relative.empty() ? "image not a regular file" : "image file missing";
        drop(image_problem, label + ": " + e.what());
        break;
      }
      // The resize inside the skip too: a 1x4000 image resizes to nothing, a named skip as well.
      auto resized_size = [&] {
        const auto dims = image::read_image_dims(path.string(), options_.max_image_pixels);
        try {
          return options_.images->resize_size(dims.height, dims.width);
        } catch (const Error& e) {
          fail("image ", path.string(), ": ", e.what());
        }
      };
      try {
        sample.resized.push_back(resized_size());
      } catch (const Error& e) {
        image_problem = "image file unreadable";
        drop(image_problem, label + ": " + e.what());
        break;
      }
      sample.image_paths.push_back(path.string());
    }
    if (!image_problem.empty()) continue;
    const auto encoded = encode(sample);
    if (!encoded.problem.empty()) {
      drop(encoded.problem, label);
      continue;
    }
    sample.length = static_cast<int64_t>(encoded.sequence.input_ids.size());
    samples_.push_back(std::move(sample));
    sample_records_.push_back(static_cast<int64_t>(i));
  }
  if (samples_.empty())
    fail("dataset ", options_.dataset_file, ": none of its ", records_, " records is usable (", summary(), ")");
  if (options_.packing) {
    std::vector<int64_t> lengths;
    for (const auto& s : samples_) lengths.push_back(s.length);
    bins_ = greedy_knapsack(lengths, options_.cutoff_len);
  }
}

void ConversationDataset::drop(const std::string& reason, const std::string& example) {
  ++dropped_[reason];
  first_example_.emplace(reason, example);
}

ConversationDataset::Encoded ConversationDataset::encode(const Sample& sample) const {
  std::vector<std::vector<int32_t>> image_tokens;
  std::vector<image::ImageTokenLayout> layouts;
  for (const auto& size : sample.resized) {
    layouts.push_back(options_.images->token_layout(size));
    const auto ids = layouts.back().token_ids(image_ids_.image, image_ids_.row_break, image_ids_.end);
    image_tokens.emplace_back(ids.begin(), ids.end());
  }
  Encoded out;
  if (options_.generation) {  // the prompt: every turn but the last one's answer, never truncated
    auto turns = template_->encode(sample.conversation, image_tokens);
    turns.back().target.clear();
    out.sequence = chat::truncate_turns(turns, 0);
    const auto& seq = out.sequence;
    if (options_.cutoff_len > 0 && static_cast<int64_t>(seq.input_ids.size()) > options_.cutoff_len)
      out.problem = "prompt longer than cutoff_len";
    else if (auto problem = check_image_tokens(seq.input_ids, seq.labels, layouts, image_ids_); !problem.empty())
      out.problem = "image tokens do not match the images";
    return out;
  }
  if (options_.last_answer_only) {
    const auto turns = template_->encode(sample.conversation, image_tokens);
    out.sequence = chat::truncate_turns(turns, 0);
    auto& labels = out.sequence.labels;
    const size_t answer_begin = labels.size() - turns.back().target.size();
    std::fill(labels.begin(), labels.begin() + static_cast<std::ptrdiff_t>(answer_begin), -100);
    if (options_.cutoff_len > 0 && static_cast<int64_t>(labels.size()) > options_.cutoff_len) {
      out.problem = "longer than cutoff_len (preference sequences are not truncated)";
      return out;
    }
  } else {
    out.sequence = chat::truncate_turns(template_->encode(sample.conversation, image_tokens), options_.cutoff_len);
  }
  const auto& seq = out.sequence;
  if (auto problem = check_image_tokens(seq.input_ids, seq.labels, layouts, image_ids_); !problem.empty()) {
    out.problem = "image tokens cut by truncation";
  } else if (std::all_of(seq.labels.begin(), seq.labels.end(), [](int32_t l) { return l == -100; })) {
    out.problem = "no supervised token left after truncation";
  }
  return out;
}

const std::string& ConversationDataset::last_user_message(int64_t index) const {
  if (index < 0 || index >= static_cast<int64_t>(samples_.size()))
    fail("dataset ", options_.dataset_file, ": sample ", index, " out of range [0, ", samples_.size(), ")");
  return samples_[static_cast<size_t>(index)].conversation.turns.back().user;
}

int64_t ConversationDataset::size() const {
  return options_.packing ? static_cast<int64_t>(bins_.size()) : static_cast<int64_t>(samples_.size());
}

std::optional<int64_t> ConversationDataset::sample_of_record(int64_t record) const {
  const auto found = std::lower_bound(sample_records_.begin(), sample_records_.end(), record);
  if (found == sample_records_.end() || *found != record) return std::nullopt;
  return found - sample_records_.begin();
}

std::optional<Batch> ConversationDataset::build(int64_t index, bool with_images) const {
  if (index < 0 || index >= static_cast<int64_t>(samples_.size()))
    fail("dataset ", options_.dataset_file, ": sample ", index, " out of range [0, ", samples_.size(), ")");
  {
    std::lock_guard<std::mutex> lock(undecodable_mutex_);
    if (undecodable_.count(index)) return std::nullopt;
  }
  const Sample& sample = samples_[static_cast<size_t>(index)];
  const auto encoded = encode(sample);
  if (!encoded.problem.empty())  // the constructor kept it, and encoding is deterministic
    fail("dataset ", options_.dataset_file, ": a kept sample no longer encodes (", encoded.problem, ")");
  const auto& seq = encoded.sequence;
  Batch out;
  out["input_ids"] = at::tensor(std::vector<int64_t>(seq.input_ids.begin(), seq.input_ids.end()), at::kLong);
  out["labels"] = at::tensor(std::vector<int64_t>(seq.labels.begin(), seq.labels.end()), at::kLong);
  if (sample.image_paths.empty() || !with_images) return out;
  std::vector<at::Tensor> pixels;
  std::vector<int64_t> sizes;
  for (const auto& path : sample.image_paths) {
    at::Tensor rgb;
    try {
      rgb = image::decode_image_file(path, options_.max_image_pixels);
    } catch (const Error& e) {
      // A prompt is never swapped for the next one: its completion would answer another prompt.
      if (options_.generation) fail("dataset ", options_.dataset_file, ": prompt ", index, ": ", e.what());
      std::lock_guard<std::mutex> lock(undecodable_mutex_);
      if (undecodable_.insert(index).second)
        std::fprintf(stderr, "[mmtrain] warning: dataset %s: sample %lld skipped: %s (%zu skipped so far)\n",
                     options_.dataset_file.c_str(), static_cast<long long>(index), e.what(), undecodable_.size());
      return std::nullopt;
    }
    pixels.push_back(options_.images->preprocess(rgb).unsqueeze(0));
    sizes.push_back(pixels.back().size(2));
    sizes.push_back(pixels.back().size(3));
  }
  out["pixel_values"] = image::concat_padded_images(pixels);
  out["image_sizes"] = at::tensor(sizes, at::kLong).view({-1, 2});
  return out;
}

int64_t ConversationDataset::skipped() const {
  std::lock_guard<std::mutex> lock(undecodable_mutex_);
  return static_cast<int64_t>(undecodable_.size());
}

std::optional<int64_t> ConversationDataset::sample_tokens(int64_t index) const {
  if (index < 0 || index >= size()) fail("dataset ", options_.dataset_file, ": index ", index, " out of range [0, ", size(), ")");
  const std::vector<int64_t> one{index};
  const auto& members = options_.packing ? bins_[static_cast<size_t>(index)] : one;
  bool replaced = false;  // a sample found undecodable since the constructor: get() replaces it
  {
    std::lock_guard<std::mutex> lock(undecodable_mutex_);  // get() takes it too: not held across
    for (int64_t s : members) replaced = replaced || undecodable_.count(s) > 0;
  }
  if (replaced) return batch_get(get(index), "input_ids").numel();
  int64_t tokens = 0;  // the constructor's encoding: image sizes from the headers, no pixel decoded
  for (int64_t s : members) tokens += samples_[static_cast<size_t>(s)].length;
  return tokens;
}

Batch ConversationDataset::get(int64_t index) const {
  if (index < 0 || index >= size()) fail("dataset ", options_.dataset_file, ": index ", index, " out of range [0, ", size(), ")");
  // Item `index`, else the next one (in item order, wrapping) that still has a sample that decodes.
  for (int64_t k = 0; k < size(); ++k) {
    const int64_t item = (index + k) % size();
    if (!options_.packing) {
      if (auto built = build(item)) return std::move(*built);
      continue;
    }
    std::vector<at::Tensor> ids, labels, positions, pixels, sizes;
    std::vector<int64_t> cu{0};
    for (int64_t s : bins_[static_cast<size_t>(item)]) {
      auto built = build(s);
      if (!built) continue;
      auto& sample = *built;
      const int64_t length = sample["input_ids"].size(0);
      ids.push_back(sample["input_ids"]);
      labels.push_back(sample["labels"]);
      positions.push_back(at::arange(length, at::kLong));
      cu.push_back(cu.back() + length);
      if (sample.count("pixel_values")) {
        pixels.push_back(sample["pixel_values"]);
        sizes.push_back(sample["image_sizes"]);
      }
    }
    if (ids.empty()) continue;
    Batch out{{"input_ids", at::cat(ids)}, {"labels", at::cat(labels)}, {"position_ids", at::cat(positions)},
              {"cu_seqlens", at::tensor(cu, at::kLong)}};
    if (!pixels.empty()) {
      out["pixel_values"] = image::concat_padded_images(pixels);
      out["image_sizes"] = at::cat(sizes);
    }
    return out;
  }
  fail("dataset ", options_.dataset_file, ": no sample decodes any more: every one has an image that failed (",
       skipped(), " skipped; the first warnings name the files)");
}

std::string ConversationDataset::summary() const {
  int64_t dropped = 0;
  for (const auto& [reason, count] : dropped_) dropped += count;
  std::ostringstream s;
  s << "dataset " << kDatasetType << " " << options_.dataset_file << ": " << records_ << " records, "
    << samples_.size() << " kept, " << dropped << " dropped";
  for (const auto& [reason, count] : dropped_) s << "; " << count << " " << reason << " (first: " << first_example_.at(reason) << ")";
  if (options_.packing) s << "; packed into " << bins_.size() << " rows of <= " << options_.cutoff_len << " tokens";
  return s.str();
}

std::vector<std::vector<int64_t>> greedy_knapsack(const std::vector<int64_t>& lengths, int64_t capacity) {
  std::multiset<std::pair<int64_t, int64_t>> remaining;  // (length, index): ties go to the lower index
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] > capacity) fail("greedy_knapsack: length ", lengths[i], " of item ", i, " exceeds the capacity ", capacity);
    remaining.emplace(lengths[i], static_cast<int64_t>(i));
  }
  std::vector<std::vector<int64_t>> bins;
  while (!remaining.empty()) {
    std::vector<int64_t> bin;
    int64_t room = capacity;
    while (!remaining.empty()) {
      // The longest length <= room, the lowest index among equals.
      auto it = remaining.upper_bound({room, INT64_MAX});
      if (it == remaining.begin()) break;
      --it;
      it = remaining.lower_bound({it->first, INT64_MIN});
      room -= it->first;
      bin.push_back(it->second);
      remaining.erase(it);
    }
    bins.push_back(std::move(bin));
  }
  return bins;
}

namespace {

const DatasetRegistration dataset(kDatasetType, [](const DataConfig& data, const ModelConfig& model) {
  return std::make_shared<ConversationDataset>(ConversationDataOptions::from_config(data, model));
});

}  // namespace

}  // namespace mmtrain::conversation
