#include "core/param_map.h"

#include "core/error.h"
#include "core/suggest.h"

#include <algorithm>

namespace mmtrain {

ParamMap::ParamMap(const nlohmann::json& map, std::string path, std::string owner)
    : map_(map.is_null() ? nlohmann::json::object() : map), path_(std::move(path)), owner_(std::move(owner)) {
  if (!map_.is_object()) fail(where(""), ": expected a map, found ", map_.dump());
}

std::string ParamMap::where(const std::string& key) const { return key.empty() ? path_ : path_ + "." + key; }

const nlohmann::json* ParamMap::value(const std::string& key) const {
  auto it = map_.find(key);
  if (it == map_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool ParamMap::has(const std::string& key) const { return value(key) != nullptr; }

void ParamMap::type_error(const std::string& key, const char* expected) const {
  fail(where(key), ": expected ", expected, ", found ", map_.at(key).dump());
}

std::string ParamMap::get_string(const std::string& key, const std::string& fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_string()) type_error(key, "a string");
  return v->get<std::string>();
}

int64_t ParamMap::get_int(const std::string& key, int64_t fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_number_integer()) type_error(key, "an integer");
  return v->get<int64_t>();
}

double ParamMap::get_double(const std::string& key, double fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_number()) type_error(key, "a number");
  return v->get<double>();
}

bool ParamMap::get_bool(const std::string& key, bool fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_boolean()) type_error(key, "true or false");
  return v->get<bool>();
}

std::vector<int64_t> ParamMap::get_int_list(const std::string& key, const std::vector<int64_t>& fallback) const {
  const auto* v = value(key);
  if (!v) return fallback;
  if (!v->is_array()) type_error(key, "a list of integers");
  std::vector<int64_t> out;
  for (const auto& item : *v) {
    if (!item.is_number_integer()) type_error(key, "a list of integers");
    out.push_back(item.get<int64_t>());
  }
  return out;
}

ParamMap ParamMap::child(const std::string& key) const {
  const auto* v = value(key);
  if (v && !v->is_object()) type_error(key, "a map");
  return ParamMap(v ? *v : nlohmann::json::object(), where(key), owner_);
}

void ParamMap::check_known_keys(const std::vector<std::string>& known) const {
  for (auto it = map_.begin(); it != map_.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) != known.end()) continue;
    const std::string suggestion = closest_name(it.key(), known);
    fail(where(it.key()), ": unknown key for ", owner_,
         suggestion.empty() ? std::string() : " (did you mean '" + suggestion + "'?)", "; known keys: ", join_names(known));
  }
}

}  // namespace mmtrain
