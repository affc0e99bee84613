// Config reading (contract in config.h). One table of typed fields drives YAML reading,
// overrides, unknown-key detection with did-you-mean, and config_to_json, so the four can never
// disagree about which keys exist. Values are applied onto a default Config; validation runs
// once, after the file and every override have been applied.
#include "core/config.h"

#include "core/error.h"
#include "core/module_pattern.h"
#include "core/suggest.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

namespace mmtrain {
namespace {

// ---------------------------------------------------------------------------------------------
// Where a value came from, as the start of a message.

struct Origin {
  std::string source;         // config file name (or the name given for YAML text)
  std::string override_text;  // "training.lr=3e-4" for an override, empty for the file

  // "config a.yaml:12" (line of node), "config a.yaml" or "config a.yaml: override 'k=v'".
  std::string describe(const YAML::Node& node = YAML::Node()) const {
    if (!override_text.empty()) return "config " + source + ": override '" + override_text + "'";
    const YAML::Mark mark = node.Mark();
    if (mark.is_null() || mark.line < 0) return "config " + source;
    return "config " + source + ":" + std::to_string(mark.line + 1);
  }
};

struct Ctx {
  const Origin& origin;
  std::string path;  // full key path, e.g. "training.lr" or "parallel.fsdp_plan.apply_modules[2]"
};

std::string describe_value(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (null)";
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  return "a map";
}

[[noreturn]] void type_error(const Ctx& at, const YAML::Node& node, const std::string& expected) {
  fail(at.origin.describe(node), ": ", at.path, ": expected ", expected, ", found ", describe_value(node));
}

std::string trim(const std::string& s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return "";
  const auto end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

std::string join_path(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

std::string parent_path(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> segments;
  std::size_t start = 0;
  while (true) {
    const auto dot = path.find('.', start);
    segments.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) return segments;
    start = dot + 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Scalars. YAML 1.2 core-schema spellings: true/false (three casings), decimal integers, decimal
// floats with optional exponent. "1e-5" is a number here even though PyYAML reads it as a string.

bool parse_bool(const std::string& s, bool& out) {
  if (s == "true" || s == "True" || s == "TRUE") return out = true, true;
  if (s == "false" || s == "False" || s == "FALSE") return out = false, true;
  return false;
}

bool parse_int64(const std::string& s, int64_t& out) {
  if (s.empty()) return false;
  std::size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size()) return false;
  for (std::size_t j = i; j < s.size(); ++j)
    if (s[j] < '0' || s[j] > '9') return false;
  errno = 0;
  const long long value = std::strtoll(s.c_str(), nullptr, 10);
  if (errno == ERANGE) return false;
  out = value;
  return true;
}

bool parse_double(const std::string& s, double& out) {
  // strtod alone would also take "inf", "nan" and hex floats; none is a sane config value.
  bool digit = false;
  for (char c : s) {
    if (c >= '0' && c <= '9') digit = true;
    else if (c != '+' && c != '-' && c != '.' && c != 'e' && c != 'E') return false;
  }
  if (!digit) return false;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(value)) return false;
  out = value;
  return true;
}

bool is_quoted(const YAML::Node& node) {
  // yaml-cpp tags quoted scalars "!" and plain ones "?"; "!!str" spells the explicit tag.
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

// Free-form maps (model.config, dataset_param, dataloader_param) keep YAML's own typing.
nlohmann::json yaml_to_json(const YAML::Node& node, const Ctx& at) {
  if (!node.IsDefined() || node.IsNull()) return nullptr;
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    if (is_quoted(node)) return s;
    bool b;
    int64_t i;
    double d;
    if (parse_bool(s, b)) return b;
    if (parse_int64(s, i)) return i;
    if (parse_double(s, d)) return d;
    return s;
  }
  if (node.IsSequence()) {
    nlohmann::json array = nlohmann::json::array();
    for (std::size_t k = 0; k < node.size(); ++k)
      array.push_back(yaml_to_json(node[k], Ctx{at.origin, at.path + "[" + std::to_string(k) + "]"}));
    return array;
  }
  nlohmann::json object = nlohmann::json::object();
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) type_error(Ctx{at.origin, at.path}, kv.first, "scalar map keys");
    const std::string key = kv.first.Scalar();
    if (object.contains(key)) fail(at.origin.describe(kv.first), ": ", join_path(at.path, key), ": duplicate key");
    object[key] = yaml_to_json(kv.second, Ctx{at.origin, join_path(at.path, key)});
  }
  return object;
}

// ---------------------------------------------------------------------------------------------
// Codecs: read a YAML node into a field type (type errors name the key) and write it back to
// JSON in the YAML layout.

struct IntCodec {
  static int read(const YAML::Node& n, const Ctx& at) {
    int64_t v = 0;
    if (!n.IsScalar() || !parse_int64(n.Scalar(), v) || v < INT_MIN || v > INT_MAX) type_error(at, n, "an integer");
    return static_cast<int>(v);
  }
  static nlohmann::json write(int v) { return v; }
};

// Sizes MindSpeed lets the world size decide: "auto" is stored as 0.
struct AutoSizeCodec {
  static int read(const YAML::Node& n, const Ctx& at) {
    if (n.IsScalar() && n.Scalar() == "auto") return 0;
    int64_t v = 0;
    if (!n.IsScalar() || !parse_int64(n.Scalar(), v) || v < INT_MIN || v > INT_MAX)
      type_error(at, n, "an integer or auto");
    return static_cast<int>(v);
  }
  static nlohmann::json write(int v) { return v == 0 ? nlohmann::json("auto") : nlohmann::json(v); }
};

struct Int64Codec {
  static int64_t read(const YAML::Node& n, const Ctx& at) {
    int64_t v = 0;
    if (!n.IsScalar() || !parse_int64(n.Scalar(), v)) type_error(at, n, "an integer");
    return v;
  }
  static nlohmann::json write(int64_t v) { return v; }
};

struct Uint64Codec {
  static uint64_t read(const YAML::Node& n, const Ctx& at) {
    const std::string s = n.IsScalar() ? n.Scalar() : std::string();
    bool digits = !s.empty();
    for (char c : s) digits = digits && c >= '0' && c <= '9';
    errno = 0;
    const unsigned long long v = digits ? std::strtoull(s.c_str(), nullptr, 10) : 0;
    if (!digits || errno == ERANGE) type_error(at, n, "a non-negative integer");
    return v;
  }
  static nlohmann::json write(uint64_t v) { return v; }
};

struct DoubleCodec {
  static double read(const YAML::Node& n, const Ctx& at) {
    double v = 0;
    if (!n.IsScalar() || !parse_double(n.Scalar(), v)) type_error(at, n, "a number");
    return v;
  }
  static nlohmann::json write(double v) { return v; }
};

struct BoolCodec {
  static bool read(const YAML::Node& n, const Ctx& at) {
    bool v = false;
    if (!n.IsScalar() || !parse_bool(n.Scalar(), v)) type_error(at, n, "true or false");
    return v;
  }
  static nlohmann::json write(bool v) { return v; }
};

struct StringCodec {
  static std::string read(const YAML::Node& n, const Ctx& at) {
    if (!n.IsDefined() || n.IsNull()) return "";  // `load:` with nothing after it means "none"
    if (!n.IsScalar()) type_error(at, n, "a string");
    return n.Scalar();
  }
  static nlohmann::json write(const std::string& v) { return v; }
};

struct StringListCodec {
  static std::vector<std::string> read(const YAML::Node& n, const Ctx& at) {
    if (!n.IsDefined() || n.IsNull()) return {};
    if (!n.IsSequence()) type_error(at, n, "a list of strings");
    std::vector<std::string> items;
    for (std::size_t k = 0; k < n.size(); ++k) {
      if (!n[k].IsScalar()) type_error(Ctx{at.origin, at.path + "[" + std::to_string(k) + "]"}, n[k], "a string");
      items.push_back(n[k].Scalar());
    }
    return items;
  }
  static nlohmann::json write(const std::vector<std::string>& v) { return v; }
};

struct DtypeCodec {
  static at::ScalarType read(const YAML::Node& n, const Ctx& at) {
    static const std::map<std::string, at::ScalarType> names = {
        {"fp32", at::kFloat},     {"float32", at::kFloat}, {"bf16", at::kBFloat16},
        {"bfloat16", at::kBFloat16}, {"fp16", at::kHalf},   {"float16", at::kHalf}};
    const auto found = n.IsScalar() ? names.find(n.Scalar()) : names.end();
    if (found == names.end()) type_error(at, n, "a dtype: fp32, float32, bf16, bfloat16, fp16 or float16");
    return found->second;
  }
  static nlohmann::json write(at::ScalarType v) {
    switch (v) {
      case at::kFloat: return "fp32";
      case at::kBFloat16: return "bf16";
      case at::kHalf: return "fp16";
      default: return c10::toString(v);
    }
  }
};

struct JsonMapCodec {
  static nlohmann::json read(const YAML::Node& n, const Ctx& at) {
    if (!n.IsDefined() || n.IsNull()) return nlohmann::json::object();
    if (!n.IsMap()) type_error(at, n, "a map");
    return yaml_to_json(n, at);
  }
  static nlohmann::json write(const nlohmann::json& v) { return v; }
};

// ---------------------------------------------------------------------------------------------
// The field table.

struct Field {
  std::string path;
  std::function<void(Config&, const YAML::Node&, const Ctx&)> read;
  std::function<nlohmann::json(const Config&)> write;
  // Set only for free-form maps (model.config, ...): keys below them are not checked here, and
  // an override may set a key inside them ("model.config.hidden_size=64").
  std::function<nlohmann::json&(Config&)> free_form;
};

#define MMTRAIN_FIELD(path, member, Codec)                                                          \
  Field {                                                                                          \
    path, [](Config& c, const YAML::Node& n, const Ctx& at) { c.member = Codec::read(n, at); },    \
        [](const Config& c) { return Codec::write(c.member); }, nullptr                            \
  }
#define MMTRAIN_MAP_FIELD(path, member)                                                                  \
  Field {                                                                                               \
    path, [](Config& c, const YAML::Node& n, const Ctx& at) { c.member = JsonMapCodec::read(n, at); },  \
        [](const Config& c) { return JsonMapCodec::write(c.member); },                                  \
        [](Config& c) -> nlohmann::json& { return c.member; }                                           \
  }

const std::vector<Field>& field_table() {
  static const std::vector<Field> table = {
      MMTRAIN_FIELD("parallel.data_parallel_size", parallel.data_parallel_size, AutoSizeCodec),
      MMTRAIN_FIELD("parallel.fully_shard_parallel_size", parallel.fully_shard_parallel_size, AutoSizeCodec),
      MMTRAIN_FIELD("parallel.tensor_parallel_size", parallel.tensor_parallel_size, IntCodec),
      MMTRAIN_FIELD("parallel.ring_attention_size", parallel.ring_attention_size, IntCodec),
      MMTRAIN_FIELD("parallel.ulysses_parallel_size", parallel.ulysses_parallel_size, IntCodec),
      MMTRAIN_FIELD("parallel.expert_parallel_size", parallel.expert_parallel_size, IntCodec),
      MMTRAIN_FIELD("parallel.expert_fully_shard_parallel_size", parallel.expert_fully_shard_parallel_size,
                    AutoSizeCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.apply_modules", parallel.fsdp_plan.apply_modules, StringListCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.ignored_modules", parallel.fsdp_plan.ignored_modules, StringListCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.param_dtype", parallel.fsdp_plan.param_dtype, DtypeCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.reduce_dtype", parallel.fsdp_plan.reduce_dtype, DtypeCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.reshard_after_forward", parallel.fsdp_plan.reshard_after_forward,
                    BoolCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.num_to_forward_prefetch", parallel.fsdp_plan.num_to_forward_prefetch,
                    IntCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.num_to_backward_prefetch", parallel.fsdp_plan.num_to_backward_prefetch,
                    IntCodec),
      MMTRAIN_FIELD("parallel.fsdp_plan.cpu_offload", parallel.fsdp_plan.cpu_offload, BoolCodec),

      MMTRAIN_FIELD("model.model_id", model.model_id, StringCodec),
      MMTRAIN_FIELD("model.model_name_or_path", model.model_name_or_path, StringCodec),
      MMTRAIN_FIELD("model.checkpoint_path", model.checkpoint_path, StringCodec),
      MMTRAIN_FIELD("model.enable_gradient_checkpointing", model.enable_gradient_checkpointing, BoolCodec),
      MMTRAIN_MAP_FIELD("model.config", model.config),

      MMTRAIN_MAP_FIELD("data.dataset_param", data.dataset_param),
      MMTRAIN_MAP_FIELD("data.dataloader_param", data.dataloader_param),

      MMTRAIN_FIELD("features.loss_cfg.loss_type", features.loss_type, StringCodec),
      MMTRAIN_FIELD("features.recompute", features.recompute, BoolCodec),
      MMTRAIN_FIELD("features.recompute_plan.apply_modules", features.recompute_plan.apply_modules,
                    StringListCodec),
      MMTRAIN_FIELD("features.recompute_plan.use_reentrant", features.recompute_plan.use_reentrant, BoolCodec),
      MMTRAIN_FIELD("features.enable_activation_offload", features.enable_activation_offload, BoolCodec),
      MMTRAIN_FIELD("features.activation_offload_plan.apply_modules", features.activation_offload_modules,
                    StringListCodec),

      MMTRAIN_FIELD("training.micro_batch_size", training.micro_batch_size, IntCodec),
      MMTRAIN_FIELD("training.gradient_accumulation_steps", training.gradient_accumulation_steps, IntCodec),
      MMTRAIN_FIELD("training.global_batch_size", training.global_batch_size, IntCodec),
      MMTRAIN_FIELD("training.seed", training.seed, Uint64Codec),
      MMTRAIN_FIELD("training.lr", training.lr, DoubleCodec),
      MMTRAIN_FIELD("training.lr_min", training.lr_min, DoubleCodec),
      MMTRAIN_FIELD("training.lr_warmup_ratio", training.lr_warmup_ratio, DoubleCodec),
      MMTRAIN_FIELD("training.lr_decay_style", training.lr_decay_style, StringCodec),
      MMTRAIN_FIELD("training.weight_decay", training.weight_decay, DoubleCodec),
      MMTRAIN_FIELD("training.adam_beta1", training.adam_beta1, DoubleCodec),
      MMTRAIN_FIELD("training.adam_beta2", training.adam_beta2, DoubleCodec),
      MMTRAIN_FIELD("training.adam_eps", training.adam_eps, DoubleCodec),
      MMTRAIN_FIELD("training.clip_grad", training.clip_grad, DoubleCodec),
      MMTRAIN_FIELD("training.train_iters", training.train_iters, Int64Codec),
      MMTRAIN_FIELD("training.optimizer", training.optimizer, StringCodec),
      MMTRAIN_FIELD("training.adam_fused", training.adam_fused, BoolCodec),
      MMTRAIN_FIELD("training.init_model_with_meta_device", training.init_model_with_meta_device, BoolCodec),
      MMTRAIN_FIELD("training.load", training.load, StringCodec),
      MMTRAIN_FIELD("training.no_load_optim", training.no_load_optim, BoolCodec),
      MMTRAIN_FIELD("training.no_load_rng", training.no_load_rng, BoolCodec),
      MMTRAIN_FIELD("training.save", training.save, StringCodec),
      MMTRAIN_FIELD("training.save_interval", training.save_interval, Int64Codec),
      MMTRAIN_FIELD("training.log_interval", training.log_interval, Int64Codec),
      MMTRAIN_FIELD("training.exit_interval", training.exit_interval, Int64Codec),
      MMTRAIN_FIELD("training.use_deter_comp", training.use_deter_comp, BoolCodec),
      MMTRAIN_FIELD("training.plugin", training.plugin, StringListCodec),

      MMTRAIN_FIELD("logging.output_dir", logging.output_dir, StringCodec),
      MMTRAIN_FIELD("logging.progress", logging.progress, BoolCodec),
      MMTRAIN_FIELD("logging.hardware_flops", logging.hardware_flops, DoubleCodec),
  };
  return table;
}

#undef MMTRAIN_FIELD
#undef MMTRAIN_MAP_FIELD

// Fields by path, the sections (every proper prefix of a field path; "" is the top level) and
// each section's children in table order, for did-you-mean and "known keys" lists.
class Schema {
 public:
  static const Schema& get() {
    static const Schema schema;
    return schema;
  }
  const Field* field(const std::string& path) const {
    const auto found = fields_.find(path);
    return found == fields_.end() ? nullptr : found->second;
  }
  bool is_section(const std::string& path) const { return children_.count(path) != 0; }
  const std::vector<std::string>& children(const std::string& section) const {
    static const std::vector<std::string> none;
    const auto found = children_.find(section);
    return found == children_.end() ? none : found->second;
  }

 private:
  Schema() {
    for (const auto& f : field_table()) {
      fields_[f.path] = &f;
      std::string child = f.path;
      while (true) {
        const std::string parent = parent_path(child);
        auto& siblings = children_[parent];
        const std::string name = parent.empty() ? child : child.substr(parent.size() + 1);
        if (std::find(siblings.begin(), siblings.end(), name) == siblings.end()) siblings.push_back(name);
        if (parent.empty()) break;
        child = parent;
      }
    }
  }
  std::map<std::string, const Field*> fields_;
  std::map<std::string, std::vector<std::string>> children_;
};

// segments[bad] is not a key of the section segments[0..bad).
[[noreturn]] void unknown_key(const std::vector<std::string>& segments, std::size_t bad, const std::string& where) {
  std::string section, full;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (i < bad) section = join_path(section, segments[i]);
    full = join_path(full, segments[i]);
  }
  const auto& known = Schema::get().children(section);
  const std::string suggestion = closest_name(segments[bad], known);
  std::ostringstream message;
  message << where << ": unknown key '" << full << "'";
  if (segments[bad] == "<<") message << " (YAML merge keys are not supported; repeat the keys or use a scalar alias)";
  if (!suggestion.empty()) {
    std::string fixed = join_path(section, suggestion);
    for (std::size_t i = bad + 1; i < segments.size(); ++i) fixed = join_path(fixed, segments[i]);
    message << " (did you mean '" << fixed << "'?)";
  } else {
    message << "; known keys " << (section.empty() ? std::string("at the top level") : "under '" + section + "'")
            << ": " << join_names(known);
  }
  throw Error(message.str());
}

void read_section(Config& config, const YAML::Node& map, const std::string& section, const Origin& origin);

void read_value(Config& config, const std::string& path, const YAML::Node& value, const Origin& origin,
                const YAML::Node& key_node) {
  const Schema& schema = Schema::get();
  if (const Field* field = schema.field(path)) {
    field->read(config, value, Ctx{origin, path});
  } else if (schema.is_section(path)) {
    read_section(config, value, path, origin);
  } else {
    const auto segments = split_path(path);
    unknown_key(segments, segments.size() - 1, origin.describe(key_node));
  }
}

// Applies the keys present in map onto config; keys not mentioned keep their current values.
void read_section(Config& config, const YAML::Node& map, const std::string& section, const Origin& origin) {
  const Ctx at{origin, section.empty() ? std::string("top level") : section};
  if (!map.IsDefined() || map.IsNull()) return;  // `features:` with nothing under it
  if (!map.IsMap()) type_error(at, map, "a map");
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) type_error(at, kv.first, "scalar map keys");
    const std::string& key = kv.first.Scalar();
    // Dotted keys would alias nested ones ("fsdp_plan.param_dtype:" under parallel); only the
    // nested spelling exists in the YAML layout.
    if (key.empty() || key.find('.') != std::string::npos)
      fail(origin.describe(kv.first), ": ", at.path, ": expected a plain key (nest maps instead of writing dots), found '",
           key, "'");
    const std::string path = join_path(section, key);
    if (!seen.insert(path).second) fail(origin.describe(kv.first), ": ", path, ": duplicate key");
    read_value(config, path, kv.second, origin, kv.first);
  }
}

// ---------------------------------------------------------------------------------------------
// Overrides.

YAML::Node scalar_or_yaml(const std::string& text) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception&) {
    // Not valid YAML on its own (e.g. "{*}"): take the text literally.
    return YAML::Node(text);
  }
}

// YAML flow sequences cannot hold "{" in plain scalars, so "[layers.{*}, x.{0-3,5}]" would not
// parse; lists are split here at top-level commas, braces and quotes respected.
YAML::Node parse_override_value(const std::string& raw, const Origin& origin) {
  const std::string text = trim(raw);
  if (text.size() < 2 || text.front() != '[' || text.back() != ']') return scalar_or_yaml(text);
  YAML::Node list(YAML::NodeType::Sequence);
  const std::string inner = text.substr(1, text.size() - 2);
  if (trim(inner).empty()) return list;
  int depth = 0;
  char quote = 0;
  std::string item;
  auto push_item = [&] {
    const std::string trimmed = trim(item);
    if (trimmed.empty())
      fail(origin.describe(), ": expected a list like [a, b], found an empty item in '", text, "'");
    list.push_back(scalar_or_yaml(trimmed));
    item.clear();
  };
  for (char c : inner) {
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 0) {
      push_item();
      continue;
    }
    item += c;
  }
  push_item();
  return list;
}

void apply_override(Config& config, const std::string& text, const std::string& source) {
  const Origin origin{source, text};
  const auto equals = text.find('=');
  const std::string path = trim(text.substr(0, equals));
  if (equals == std::string::npos || path.empty())
    fail(origin.describe(), ": expected key.path=value, found ",
         equals == std::string::npos ? "no '='" : "no key before '='");
  const YAML::Node value = parse_override_value(text.substr(equals + 1), origin);
  const auto segments = split_path(path);
  for (const auto& segment : segments)
    if (segment.empty()) fail(origin.describe(), ": expected a dotted key path, found an empty segment in '", path, "'");

  const Schema& schema = Schema::get();
  std::string prefix;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::string here = join_path(prefix, segments[i]);
    if (const Field* field = schema.field(here)) {
      if (i + 1 == segments.size()) {
        field->read(config, value, Ctx{origin, here});
        return;
      }
      if (!field->free_form)
        fail(origin.describe(), ": unknown key '", path, "' ('", here, "' is a single value, not a map)");
      // A key inside a free-form map: create the maps on the way, like the YAML would.
      nlohmann::json* node = &field->free_form(config);
      std::string walked = here;
      for (std::size_t k = i + 1; k < segments.size(); ++k) {
        if (node->is_null()) *node = nlohmann::json::object();
        if (!node->is_object())
          fail(origin.describe(), ": ", walked, ": expected a map to set '", segments[k], "' in, found ", node->dump());
        node = &(*node)[segments[k]];
        walked = join_path(walked, segments[k]);
      }
      *node = yaml_to_json(value, Ctx{origin, path});
      return;
    }
    if (!schema.is_section(here)) unknown_key(segments, i, origin.describe());
    prefix = here;
  }
  // The path names a whole section: its value is a map of that section's keys.
  read_section(config, value, path, origin);
}

// ---------------------------------------------------------------------------------------------
// Derived fields and validation.

void derive_data_names(Config& config) {
  auto where = [&](const std::string& path) { return "config " + config.source_path + ": " + path; };
  auto optional_string = [&](const nlohmann::json& map, const std::string& key, const std::string& path) {
    if (!map.contains(key) || map[key].is_null()) return std::string();
    if (!map[key].is_string()) fail(where(path), ": expected a string, found ", map[key].dump());
    return map[key].get<std::string>();
  };
  config.data.dataset_type =
      optional_string(config.data.dataset_param, "dataset_type", "data.dataset_param.dataset_type");
  config.data.collate_model_name.clear();
  const auto& loader = config.data.dataloader_param;
  if (loader.contains("collate_param") && !loader["collate_param"].is_null()) {
    if (!loader["collate_param"].is_object())
      fail(where("data.dataloader_param.collate_param"), ": expected a map, found ", loader["collate_param"].dump());
    config.data.collate_model_name = optional_string(loader["collate_param"], "model_name",
                                                     "data.dataloader_param.collate_param.model_name");
  }
  // The seed's spelling (MindSpeed-MM FSDP configs): dataloader_param.collator_id.
  const auto collator_id = optional_string(loader, "collator_id", "data.dataloader_param.collator_id");
  if (!collator_id.empty()) {
    if (!config.data.collate_model_name.empty() && config.data.collate_model_name != collator_id)
      fail(where("data.dataloader_param.collator_id"), ": '", collator_id, "' disagrees with ",
           "data.dataloader_param.collate_param.model_name '", config.data.collate_model_name, "': give one");
    config.data.collate_model_name = collator_id;
  }
}

// auto (0) resolves to all ranks outside tensor parallelism, as MindSpeed's ParallelArguments.
int fsdp_size_from(const Config& c, int world_size) {
  const auto& p = c.parallel;
  return p.fully_shard_parallel_size == 0 ? world_size / p.tensor_parallel_size : p.fully_shard_parallel_size;
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

void validate(const Config& c) {
  auto invalid = [&](const std::string& path, const std::string& expected, const std::string& found) {
    fail("config ", c.source_path, ": ", path, ": expected ", expected, ", found ", found);
  };
  auto at_least = [&](const std::string& path, int64_t value, int64_t low) {
    if (value < low) invalid(path, ">= " + std::to_string(low), std::to_string(value));
  };
  auto auto_or_positive = [&](const std::string& path, int value) {
    if (value < 0) invalid(path, "auto or an integer >= 1", std::to_string(value));
  };
  auto one_of = [&](const std::string& path, const std::string& value, const std::vector<std::string>& known) {
    if (std::find(known.begin(), known.end(), value) == known.end())
      invalid(path, "one of " + join_names(known, "|"), "'" + value + "'");
  };
  // Written as !(ok) so that NaN can never pass.
  auto in_unit = [&](const std::string& path, double value, bool include_one) {
    if (!(value >= 0.0 && (include_one ? value <= 1.0 : value < 1.0)))
      invalid(path, include_one ? "a value in [0, 1]" : "a value in [0, 1)", number(value));
  };

  const auto& p = c.parallel;
  auto_or_positive("parallel.data_parallel_size", p.data_parallel_size);
  auto_or_positive("parallel.fully_shard_parallel_size", p.fully_shard_parallel_size);
  at_least("parallel.tensor_parallel_size", p.tensor_parallel_size, 1);
  at_least("parallel.ring_attention_size", p.ring_attention_size, 1);
  at_least("parallel.ulysses_parallel_size", p.ulysses_parallel_size, 1);
  at_least("parallel.expert_parallel_size", p.expert_parallel_size, 1);
  auto_or_positive("parallel.expert_fully_shard_parallel_size", p.expert_fully_shard_parallel_size);
  at_least("parallel.fsdp_plan.num_to_forward_prefetch", p.fsdp_plan.num_to_forward_prefetch, 0);
  at_least("parallel.fsdp_plan.num_to_backward_prefetch", p.fsdp_plan.num_to_backward_prefetch, 0);

  if (c.model.model_id.empty()) invalid("model.model_id", "a registered model name", "nothing");

  const auto& f = c.features;
  one_of("features.loss_cfg.loss_type", f.loss_type, {"default", "raw", "per-sample", "per-token"});
  if (f.recompute && f.recompute_plan.apply_modules.empty())
    invalid("features.recompute_plan.apply_modules", "at least one module pattern when features.recompute is true",
            "an empty list");
  if (f.enable_activation_offload && f.activation_offload_modules.empty())
    invalid("features.activation_offload_plan.apply_modules",
            "at least one module pattern when features.enable_activation_offload is true", "an empty list");

  const auto& t = c.training;
  at_least("training.micro_batch_size", t.micro_batch_size, 1);
  at_least("training.gradient_accumulation_steps", t.gradient_accumulation_steps, 1);
  if (t.global_batch_size < 0)
    invalid("training.global_batch_size", "0 (derived) or a positive integer", std::to_string(t.global_batch_size));
  at_least("training.train_iters", t.train_iters, 0);
  if (!(t.lr_min >= 0.0)) invalid("training.lr_min", ">= 0", number(t.lr_min));
  if (!(t.lr >= t.lr_min)) invalid("training.lr", ">= training.lr_min (" + number(t.lr_min) + ")", number(t.lr));
  in_unit("training.lr_warmup_ratio", t.lr_warmup_ratio, true);
  one_of("training.lr_decay_style", t.lr_decay_style, {"constant", "linear", "cosine"});
  if (!(t.weight_decay >= 0.0)) invalid("training.weight_decay", ">= 0", number(t.weight_decay));
  in_unit("training.adam_beta1", t.adam_beta1, false);
  in_unit("training.adam_beta2", t.adam_beta2, false);
  if (!(t.adam_eps > 0.0)) invalid("training.adam_eps", "> 0", number(t.adam_eps));
  if (!(t.clip_grad >= 0.0)) invalid("training.clip_grad", ">= 0 (0 = no clipping)", number(t.clip_grad));
  one_of("training.optimizer", t.optimizer, {"adamw"});
  at_least("training.save_interval", t.save_interval, 0);
  at_least("training.exit_interval", t.exit_interval, 0);
  at_least("training.log_interval", t.log_interval, 1);

  if (!(c.logging.hardware_flops >= 0.0))
    invalid("logging.hardware_flops", ">= 0 (0 = no MFU)", number(c.logging.hardware_flops));
  if (c.logging.output_dir.empty()) invalid("logging.output_dir", "a directory", "nothing");

  // Selector syntax is checked now; whether each selector matches a module needs the model.
  auto check_patterns = [&](const std::string& path, const std::vector<std::string>& patterns) {
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      try {
        module_pattern_check(patterns[i]);
      } catch (const Error& e) {
        fail("config ", c.source_path, ": ", path, "[", i, "]: ", e.what());
      }
    }
  };
  check_patterns("parallel.fsdp_plan.apply_modules", p.fsdp_plan.apply_modules);
  check_patterns("parallel.fsdp_plan.ignored_modules", p.fsdp_plan.ignored_modules);
  check_patterns("features.recompute_plan.apply_modules", f.recompute_plan.apply_modules);
  check_patterns("features.activation_offload_plan.apply_modules", f.activation_offload_modules);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

Config config_from_yaml_string(const std::string& text, const std::string& source_name,
                               const std::vector<std::string>& overrides) {
  Config config;
  config.source_path = source_name;
  const Origin origin{source_name, ""};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    fail("config ", source_name, ":", e.mark.line + 1, ":", e.mark.column + 1,
         ": expected valid YAML, found a syntax error: ", e.msg);
  }
  read_section(config, root, "", origin);
  for (const auto& override_text : overrides) apply_override(config, override_text, source_name);
  derive_data_names(config);
  validate(config);
  return config;
}

Config config_load(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("config ", path, ": expected a YAML file, found no such file");
  if (std::filesystem::is_directory(path, ec)) fail("config ", path, ": expected a YAML file, found a directory");
  std::ifstream in(path);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in) fail("config ", path, ": expected a readable YAML file, found one that cannot be read");
  return config_from_yaml_string(text.str(), path, overrides);
}

nlohmann::json config_to_json(const Config& config) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& field : field_table()) {
    nlohmann::json* node = &out;
    for (const auto& segment : split_path(field.path)) node = &(*node)[segment];
    *node = field.write(config);
  }
  return out;
}

void config_check_world(const Config& c, int world_size) {
  const std::string where = "config " + c.source_path + ": ";
  const auto& p = c.parallel;
  if (world_size < 1) fail(where, "world size: expected >= 1, found ", world_size);
  // A Config built in code skips validate(); sizes below 1 would divide by zero here.
  for (const auto& [name, size] : {std::pair<const char*, int>{"tensor_parallel_size", p.tensor_parallel_size},
                                   {"ulysses_parallel_size", p.ulysses_parallel_size},
                                   {"ring_attention_size", p.ring_attention_size},
                                   {"expert_parallel_size", p.expert_parallel_size}})
    if (size < 1) fail(where, "parallel.", name, ": expected >= 1, found ", size);
  if (p.fully_shard_parallel_size < 0 || p.expert_fully_shard_parallel_size < 0)
    fail(where, "parallel: expected auto or positive fully-shard sizes, found ", p.fully_shard_parallel_size, " and ",
         p.expert_fully_shard_parallel_size);
  const int tp = p.tensor_parallel_size, cp = p.ulysses_parallel_size * p.ring_attention_size;
  if (world_size % (tp * cp) != 0)
    fail(where, "parallel: expected the world size ", world_size,
         " to be divisible by tensor_parallel_size * ulysses_parallel_size * ring_attention_size = ", tp, " * ",
         p.ulysses_parallel_size, " * ", p.ring_attention_size, " = ", tp * cp, ", found remainder ",
         world_size % (tp * cp));
  const int fsdp = fsdp_size_from(c, world_size);
  if ((world_size / tp) % fsdp != 0)
    fail(where, "parallel.fully_shard_parallel_size: expected auto or a divisor of world size / tensor_parallel_size = ",
         world_size / tp, ", found ", fsdp);
  if (fsdp % cp != 0)
    fail(where, "parallel.fully_shard_parallel_size: expected a multiple of ulysses_parallel_size * ring_attention_size = ",
         cp, " (FSDP shards across the context-parallel ranks too), found ", fsdp);
  const int dp = world_size / (tp * cp);
  if (p.data_parallel_size != 0 && p.data_parallel_size != dp)
    fail(where, "parallel.data_parallel_size: expected auto or world size / (tensor_parallel_size * ",
         "ulysses_parallel_size * ring_attention_size) = ", dp, ", found ", p.data_parallel_size);
  const int ep = p.expert_parallel_size;
  if (world_size % ep != 0)
    fail(where, "parallel.expert_parallel_size: expected a divisor of the world size ", world_size, ", found ", ep);
  const int efsdp = p.expert_fully_shard_parallel_size == 0 ? world_size / ep : p.expert_fully_shard_parallel_size;
  if (world_size % (ep * efsdp) != 0)
    fail(where, "parallel.expert_fully_shard_parallel_size: expected auto or a divisor of world size / ",
         "expert_parallel_size = ", world_size / ep, ", found ", efsdp);
  const auto& t = c.training;
  const int64_t global = int64_t{t.micro_batch_size} * t.gradient_accumulation_steps * dp;
  if (t.global_batch_size != 0 && t.global_batch_size != global)
    fail(where, "training.global_batch_size: expected 0 (derived) or micro_batch_size * gradient_accumulation_steps * ",
         "data-parallel size = ", t.micro_batch_size, " * ", t.gradient_accumulation_steps, " * ", dp, " = ", global,
         ", found ", t.global_batch_size);
}

void config_check_supported(const Config& c, int world_size) {
  config_check_world(c, world_size);
  const std::string where = "config " + c.source_path + ": ";
  auto refuse = [&](const std::string& key, const std::string& value, const std::string& what) {
    fail(where, key, ": ", value, " needs ", what, ", which mmtrain does not implement yet; use the default");
  };
  const auto& p = c.parallel;
  if (p.tensor_parallel_size != 1) refuse("parallel.tensor_parallel_size", std::to_string(p.tensor_parallel_size), "tensor parallelism");
  if (p.ulysses_parallel_size != 1)
    refuse("parallel.ulysses_parallel_size", std::to_string(p.ulysses_parallel_size), "Ulysses context parallelism");
  if (p.ring_attention_size != 1) refuse("parallel.ring_attention_size", std::to_string(p.ring_attention_size), "ring attention");
  if (p.expert_parallel_size != 1) refuse("parallel.expert_parallel_size", std::to_string(p.expert_parallel_size), "expert parallelism");
  if (fsdp_size_from(c, world_size) != world_size)
    refuse("parallel.fully_shard_parallel_size", std::to_string(p.fully_shard_parallel_size),
           "HSDP (replicated shard groups; FSDP here shards over all " + std::to_string(world_size) + " ranks)");
  if (!p.fsdp_plan.ignored_modules.empty()) refuse("parallel.fsdp_plan.ignored_modules", "a non-empty list", "unsharded modules");
  if (p.fsdp_plan.cpu_offload) refuse("parallel.fsdp_plan.cpu_offload", "true", "parameter/optimizer offload to the host");
  if (c.features.enable_activation_offload) refuse("features.enable_activation_offload", "true", "activation offload");
  if (c.features.loss_type != "raw")
    refuse("features.loss_cfg.loss_type", "'" + c.features.loss_type + "'", "a loss reduction other than the model's own ('raw')");
  if (c.model.enable_gradient_checkpointing)
    refuse("model.enable_gradient_checkpointing", "true", "model-internal checkpointing (features.recompute does this)");
}

int config_fsdp_size(const Config& config, int world_size) {
  config_check_world(config, world_size);
  return fsdp_size_from(config, world_size);
}

int config_dp_size(const Config& config, int world_size) {
  config_check_world(config, world_size);
  const auto& p = config.parallel;
  return world_size / (p.tensor_parallel_size * p.ulysses_parallel_size * p.ring_attention_size);
}

int64_t config_global_batch_size(const Config& config, int world_size) {
  return int64_t{config.training.micro_batch_size} * config.training.gradient_accumulation_steps *
         config_dp_size(config, world_size);
}

}  // namespace mmtrain
