#include "io/safetensors_header.h"

#include "core/error.h"
#include "core/json_read.h"

#include <nlohmann/json.hpp>

namespace mmtrain {
namespace {

constexpr const char* kMetadataKey = "__metadata__";

// Depths: 1 the header object, 2 an entry's object (or __metadata__), 3 a shape or offsets array.
// A field this reader does not know is skipped whole (skip_depth_ > 0 while inside it).
class HeaderSax : public nlohmann::json_sax<nlohmann::json> {
 public:
  HeaderSax(std::map<std::string, std::string>& metadata, const std::function<void(SafetensorsHeaderEntry&&)>& on_entry,
            std::string where)
      : metadata_(metadata), on_entry_(on_entry), where_(std::move(where)) {}

  bool null() override { return scalar("null"); }
  bool boolean(bool) override { return scalar("a boolean"); }
  bool number_integer(number_integer_t value) override {
    return value < 0 ? negative_number() : number(static_cast<uint64_t>(value));
  }
  bool number_unsigned(number_unsigned_t value) override { return number(value); }
  bool number_float(number_float_t, const string_t& text) override { return scalar("the number " + text); }
  bool binary(binary_t&) override { return scalar("binary"); }
  bool string(string_t& value) override {
    if (skip_depth_ > 0) return true;
    if (depth_ == 2 && in_metadata_) {
      metadata_[key_] = std::move(value);
      return true;
    }
    if (depth_ == 2 && field_ == Field::dtype) {
      entry_.dtype = std::move(value);
      seen_dtype_ = true;
      return true;
    }
    return scalar("a string");
  }
  bool start_object(std::size_t) override {
    if (skip_depth_ > 0 || consume_skip()) return ++skip_depth_, true;
    if (depth_ == 0) return ++depth_, true;
    if (depth_ == 1) {
      ++depth_;
      if (key_ == kMetadataKey) {
        in_metadata_ = true;
        return true;
      }
      entry_ = {};
      entry_.name = std::move(key_);
      seen_dtype_ = seen_shape_ = seen_offsets_ = false;
      return true;
    }
    return scalar("an object");
  }
  bool end_object() override {
    if (skip_depth_ > 0) return --skip_depth_, true;
    if (depth_ == 2 && !in_metadata_) {
      if (!(seen_dtype_ && seen_shape_ && seen_offsets_))
        fail(tensor(), "expected {\"dtype\", \"shape\", \"data_offsets\"}, found no ",
             !seen_dtype_ ? "\"dtype\"" : !seen_shape_ ? "\"shape\"" : "\"data_offsets\"");
      on_entry_(std::move(entry_));
    }
    if (depth_ == 2) in_metadata_ = false;
    --depth_;
    field_ = Field::none;
    return true;
  }
  bool start_array(std::size_t) override {
    if (skip_depth_ > 0 || consume_skip()) return ++skip_depth_, true;
    if (depth_ == 0) fail(where_, ": header is a JSON array, expected an object");
    if (depth_ == 2 && !in_metadata_ && (field_ == Field::shape || field_ == Field::offsets)) {
      ++depth_;
      if (field_ == Field::shape) seen_shape_ = true;
      return true;
    }
    return scalar("an array");
  }
  bool end_array() override {
    if (skip_depth_ > 0) return --skip_depth_, true;
    if (field_ == Field::offsets) {
      if (offsets_.size() != 2) fail(tensor(), "data_offsets must be [begin, end], found ", offsets_.size(), " numbers");
      entry_.data_begin = offsets_[0];
      entry_.data_end = offsets_[1];
      offsets_.clear();
      seen_offsets_ = true;
    }
    --depth_;
    field_ = Field::none;
    return true;
  }
  bool key(string_t& value) override {
    if (skip_depth_ > 0) return true;
    if (depth_ == 1) {
      key_ = std::move(value);
      return true;
    }
    if (in_metadata_) {
      key_ = std::move(value);
      return true;
    }
    field_ = value == "dtype" ? Field::dtype : value == "shape" ? Field::shape : value == "data_offsets" ? Field::offsets : Field::other;
    if (field_ == Field::other) skip_next_ = true;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) override {
    fail(where_, ": not valid JSON: ", e.what());
  }

 private:
  enum class Field { none, dtype, shape, offsets, other };

  std::string tensor() const { return where_ + ": tensor '" + entry_.name + "': "; }

  // A value where this reader expects another; an unknown field's value is skipped instead.
  bool scalar(const std::string& found) {
    if (skip_depth_ > 0) return true;
    if (consume_skip()) return true;
    if (depth_ == 0) fail(where_, ": header is JSON ", found, ", expected an object");
    if (depth_ == 1) fail(where_, ": '", key_, "' must be an object, found ", found);
    if (in_metadata_) fail(where_, ": __metadata__ key '", key_, "' must be a string, found ", found);
    switch (field_) {
      case Field::dtype: fail(tensor(), "unknown dtype: expected a string, found ", found);
      case Field::shape: fail(tensor(), "shape must be an array of non-negative integers, found ", found);
      case Field::offsets: fail(tensor(), "data_offsets must be [begin, end], found ", found);
      default: fail(tensor(), "unexpected ", found);
    }
  }
  bool number(uint64_t value) {
    if (skip_depth_ > 0 || consume_skip()) return true;
    if (depth_ == 3 && field_ == Field::shape) {
      if (value > static_cast<uint64_t>(INT64_MAX)) fail(tensor(), "shape must hold non-negative integers, found ", value);
      entry_.shape.push_back(static_cast<int64_t>(value));
      return true;
    }
    if (depth_ == 3 && field_ == Field::offsets) {
      if (offsets_.size() == 2) fail(tensor(), "data_offsets must be [begin, end], found more than 2 numbers");
      offsets_.push_back(value);
      return true;
    }
    return scalar("the number " + std::to_string(value));
  }
  bool negative_number() {
    if (skip_depth_ > 0 || consume_skip()) return true;
    if (depth_ == 3 && field_ == Field::shape) fail(tensor(), "shape must hold non-negative integers, found a negative one");
    if (depth_ == 3 && field_ == Field::offsets) fail(tensor(), "data_offsets must be non-negative, found a negative one");
    return scalar("a negative number");
  }
  // An unknown field's value: a scalar is consumed here; an object or array begins a skip.
  bool consume_skip() {
    if (!skip_next_) return false;
    skip_next_ = false;
    return true;
  }

  std::map<std::string, std::string>& metadata_;
  const std::function<void(SafetensorsHeaderEntry&&)>& on_entry_;
  std::string where_;
  SafetensorsHeaderEntry entry_;  // the one being read
  int depth_ = 0;
  int skip_depth_ = 0;
  bool skip_next_ = false;
  bool in_metadata_ = false;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  Field field_ = Field::none;
  std::string key_;
  std::vector<uint64_t> offsets_;
};

}  // namespace

std::map<std::string, std::string> safetensors_header_parse(const std::string& text, const std::string& where,
                                                            const std::function<void(SafetensorsHeaderEntry&&)>& on_entry) {
  if (json_nesting_depth(text) > kMaxJsonDepth)
    fail(where, ": JSON nested more than ", kMaxJsonDepth, " levels deep; refused (no valid file nests that deep)");
  std::map<std::string, std::string> metadata;
  HeaderSax sax(metadata, on_entry, where);
  nlohmann::json::sax_parse(text, &sax);
  return metadata;
}

}  // namespace mmtrain
