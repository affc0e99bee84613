#include "plan/device_profile.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/subprocess.h"
#include "io/user_file.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kBuiltIn = {"h200", "h100", "a100", "910b3"};

double positive(const nlohmann::json& object, const std::string& key, const std::string& where, double maximum) {
  if (!object.is_object() || !object.contains(key))
    fail(where, ": '", key, "' is missing");
  const auto& value = object[key];
  if (!value.is_number()) fail(where, ": '", key, "' must be a number, found ", value.dump());
  const double x = value.get<double>();
  if (!(x > 0 && x <= maximum)) fail(where, ": '", key, "' must be in (0, ", maximum, "], found ", value.dump());
  return x;
}

}  // namespace

DeviceProfile device_profile_from_json(const std::string& text, const std::string& where) {
  const nlohmann::json j = json_parse_checked(text, where);  // a file from elsewhere: depth-checked
  if (!j.is_object()) fail(where, ": expected a JSON object");
  constexpr double kAny = 1e12;
  DeviceProfile p;
  p.name = json_string(j, "name", where);
  if (p.name.empty()) fail(where, ": 'name' is empty");
  if (j.contains("description")) p.description = json_string(j, "description", where);
  p.peak_bf16_tflops = positive(j, "peak_bf16_tflops", where, kAny);
  p.peak_fp32_tflops = positive(j, "peak_fp32_tflops", where, kAny);
  p.memory_gb = positive(j, "memory_gb", where, kAny);
  p.memory_gb_per_s = positive(j, "memory_gb_per_s", where, kAny);
  p.intra_node_gb_per_s = positive(j, "intra_node_gb_per_s", where, kAny);
  p.inter_node_gb_per_s = positive(j, "inter_node_gb_per_s", where, kAny);
  p.host_link_gb_per_s = positive(j, "host_link_gb_per_s", where, kAny);
  p.host_memory_gb = positive(j, "host_memory_gb", where, kAny);
  p.host_memory_gb_per_s = positive(j, "host_memory_gb_per_s", where, kAny);
  p.disk_read_gb_per_s = positive(j, "disk_read_gb_per_s", where, kAny);
  p.disk_write_gb_per_s = positive(j, "disk_write_gb_per_s", where, kAny);
  if (!j.contains("efficiency")) fail(where, ": 'efficiency' is missing");
  const std::string in_efficiency = where + ": efficiency";
  p.gemm_efficiency = positive(j["efficiency"], "gemm", in_efficiency, 1.0);
  p.attention_efficiency = positive(j["efficiency"], "attention", in_efficiency, 1.0);
  p.comm_efficiency = positive(j["efficiency"], "comm", in_efficiency, 1.0);
  p.overlap = positive(j["efficiency"], "overlap", in_efficiency, 1.0);
  return p;
}

std::string device_profile_path(const std::string& name_or_path) {
  fs::path path(name_or_path);
  const bool named = name_or_path.find('/') == std::string::npos && path.extension() != ".json";
  if (named) {
    bool known = false;
    for (const auto& name : kBuiltIn) known = known || name == name_or_path;
    if (!known) {
      std::string names;
      for (const auto& name : kBuiltIn) names += (names.empty() ? "" : ", ") + name;
      fail("device profile '", name_or_path, "': not a built-in profile (", names, ") nor a path to a .json file");
    }
    path = fs::path(executable_dir()) / ".." / "share" / "mmtrain" / "profiles" / (name_or_path + ".json");
  }
  return path.string();
}

DeviceProfile load_device_profile(const std::string& name_or_path) {
  const std::string path = device_profile_path(name_or_path);
  return device_profile_from_json(read_user_file(path, "device profile " + path, kMaxSmallJsonBytes),
                                  "device profile " + path);
}

}  // namespace mmtrain
