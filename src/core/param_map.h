// Reading a free-form YAML map that a component checks itself (data.dataset_param, a collator's
// data.dataloader_param.collate_param, a model's model.config; kept as JSON by the config loader): typed lookups with
// defaults and unknown-key checks, every error naming the full key
// (data.dataset_param.basic_parameters.cutoff_len) and the component that reads it.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

class ParamMap {
 public:
  // `map` is the value at the YAML path `path` ("data.dataset_param"); `owner` names its reader
  // in unknown-key errors ("dataset huggingface", "collator pixtral"). A null map is empty.
  ParamMap(const nlohmann::json& map, std::string path, std::string owner);

  std::string where(const std::string& key) const;
  bool has(const std::string& key) const;
  // Fails naming the key when its value has the wrong type; null or absent gives the fallback.
  std::string get_string(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<int64_t> get_int_list(const std::string& key, const std::vector<int64_t>& fallback) const;
  const nlohmann::json& raw() const { return map_; }  // the map itself
  // The sub-map at key (an empty map when absent).
  ParamMap child(const std::string& key) const;
  // Fails on the first key not in `known`, with a did-you-mean and the known list.
  void check_known_keys(const std::vector<std::string>& known) const;

 private:
  const nlohmann::json* value(const std::string& key) const;
  [[noreturn]] void type_error(const std::string& key, const char* expected) const;

  nlohmann::json map_;
  std::string path_;
  std::string owner_;
};

}  // namespace mmtrain
