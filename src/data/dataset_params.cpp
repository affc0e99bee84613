#include "data/dataset_params.h"

#include "core/error.h"
#include "core/suggest.h"

#include <algorithm>

namespace mmtrain {

DatasetParams::DatasetParams(const nlohmann::json& map, std::string dataset_type, std::string prefix)
    : map_(map.is_null() ? nlohmann::json::object() : map), dataset_type_(std::move(dataset_type)), prefix_(std::move(prefix)) {
  if (!map_.is_object()) fail(where(""), ": expected a map, found ", map_.dump());
}

std::string DatasetParams::where(const std::string& key) const {
  std::string path = "data.dataset_param";
  if (!prefix_.empty()) path += "." + prefix_;
  if (!key.empty()) path += "." + key;
  return path;
}

const nlohmann::json* DatasetParams::value(const std::string& key) const {
  auto it = map_.find(key);
  if (it == map_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool DatasetParams::has(const std::string& key) const { return value(key) != nullptr; }

void DatasetParams::type_error(const std::string& key, const char* expected) const {
  fail(where(key), ": expected ", expected, ", found ", map_.at(key).dump());
}

std::string DatasetParams::get_string(const std::string& key, const std::string& fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_string()) type_error(key, "a string");
  return v->get<std::string>();
}

int64_t DatasetParams::get_int(const std::string& key, int64_t fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_number_integer()) type_error(key, "an integer");
  return v->get<int64_t>();
}

double DatasetParams::get_double(const std::string& key, double fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_number()) type_error(key, "a number");
  return v->get<double>();
}

bool DatasetParams::get_bool(const std::string& key, bool fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_boolean()) type_error(key, "true or false");
  return v->get<bool>();
}

DatasetParams DatasetParams::child(const std::string& key) const {
  const auto* v = value(key);
  if (v && !v->is_object()) type_error(key, "a map");
  return DatasetParams(v ? *v : nlohmann::json::object(), dataset_type_, prefix_.empty() ? key : prefix_ + "." + key);
}

void DatasetParams::check_known_keys(const std::vector<std::string>& known) const {
  for (auto it = map_.begin(); it != map_.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    const std::string suggestion = closest_name(it.key(), known);
    fail(where(it.key()), ": unknown key for dataset ", dataset_type_,
         suggestion.empty() ? std::string() : " (did you mean '" + suggestion + "'?)", "; known keys: ", join_names(known));
  }
}

}  // namespace mmtrain
