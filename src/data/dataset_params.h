// Reading a dataset's free-form YAML map (data.dataset_param, kept as JSON by the config loader):
// typed lookups with defaults and unknown-key checks, every error naming the full key
// (data.dataset_param.basic_parameters.cutoff_len) and the dataset type.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace mmtrain {

class DatasetParams {
 public:
  // `map` is the sub-map at `prefix` ("" for dataset_param itself); `dataset_type` names the
  // dataset in unknown-key errors.
  DatasetParams(const nlohmann::json& map, std::string dataset_type, std::string prefix = "");

  std::string where(const std::string& key) const;
  bool has(const std::string& key) const;
  // Fails naming the key when its value has the wrong type; null or absent gives the fallback.
  std::string get_string(const std::string& key, const std::string& fallback) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  // The sub-map at key (an empty map when absent).
  DatasetParams child(const std::string& key) const;
  // Fails on the first key not in `known`, with a did-you-mean and the known list.
  void check_known_keys(const std::vector<std::string>& known) const;

 private:
  const nlohmann::json* value(const std::string& key) const;
  [[noreturn]] void type_error(const std::string& key, const char* expected) const;

  nlohmann::json map_;
  std::string dataset_type_;
  std::string prefix_;
};

}  // namespace mmtrain
