// The generic config reader (contract in config_schema.h). Values are applied onto the struct
// the caller passes (its defaults); derivations and checks run once, after the file and every
// override have been applied.
#include "core/config_schema.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/module_pattern.h"
#include "core/suggest.h"
#include "core/text.h"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

namespace mmtrain {
namespace {

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

std::string describe_value(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (null)";
  if (node.IsScalar()) return "'" + node.Scalar() + "'";
  if (node.IsSequence()) return "a list";
  return "a map";
}

[[noreturn]] void type_error(const ConfigPlace& at, const YAML::Node& node, const std::string& expected) {
  fail(at.describe(node), ": ", at.path, ": expected ", expected, ", found ", describe_value(node));
}

// ---------------------------------------------------------------------------------------------
// Scalars (YAML 1.2 core schema).

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

// Digits with an optional sign: an integer, whether or not it fits 64 bits.
bool looks_like_integer(const YAML::Node& n) {
  if (!n.IsScalar()) return false;
  const std::string& s = n.Scalar();
  const std::size_t i = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  return i < s.size() && s.find_first_not_of("0123456789", i) == std::string::npos;
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

// Free-form maps keep YAML's own typing.
nlohmann::json yaml_to_json(const YAML::Node& node, const ConfigPlace& at) {
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
      array.push_back(yaml_to_json(node[k], at.at(at.path + "[" + std::to_string(k) + "]")));
    return array;
  }
  nlohmann::json object = nlohmann::json::object();
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) type_error(at, kv.first, "scalar map keys");
    const std::string key = kv.first.Scalar();
    if (object.contains(key)) fail(at.describe(kv.first), ": ", join_path(at.path, key), ": duplicate key");
    object[key] = yaml_to_json(kv.second, at.at(join_path(at.path, key)));
  }
  return object;
}

// Aliases make a YAML document a graph: `a: &x [*x]` contains itself, and nine levels of ten
// aliases expand to a billion values. Walked without recursion before anything reads the
// document: deeper than kMaxYamlDepth (a cycle never ends) or more than kMaxYamlValues values
// once aliases are expanded is an error. A real config has a few hundred values, 8 levels deep.
constexpr int kMaxYamlDepth = 64;
constexpr int64_t kMaxYamlValues = 100000;

void check_yaml_bounds(const YAML::Node& document, const std::string& source) {
  std::vector<std::pair<YAML::Node, int>> stack = {{document, 0}};
  int64_t values = 0;
  while (!stack.empty()) {
    auto [node, depth] = stack.back();
    stack.pop_back();
    if (++values > kMaxYamlValues)
      fail("config ", source, ": more than ", kMaxYamlValues, " values once its aliases are expanded; refused (an alias bomb?)");
    if (depth > kMaxYamlDepth)
      fail("config ", source, ": nested more than ", kMaxYamlDepth, " levels deep; refused (an alias that contains itself?)");
    if (node.IsSequence()) {
      for (const auto& child : node) stack.emplace_back(child, depth + 1);
    } else if (node.IsMap()) {
      for (const auto& kv : node) {
        stack.emplace_back(kv.first, depth + 1);
        stack.emplace_back(kv.second, depth + 1);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Overrides.

YAML::Node scalar_or_yaml(const std::string& text) {
  try {
    auto node = YAML::Load(text);
    check_yaml_bounds(node, "override '" + text + "'");
    return node;
  } catch (const YAML::Exception&) {
    // Not valid YAML on its own (e.g. "{*}"): take the text literally.
    return YAML::Node(text);
  }
}

// YAML flow sequences cannot hold "{" in plain scalars, so "[layers.{*}, x.{0-3,5}]" would not
// parse; lists are split here at top-level commas, braces and quotes respected.
YAML::Node parse_override_value(const std::string& raw, const ConfigPlace& origin) {
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
      fail(origin.describe(YAML::Node()), ": expected a list like [a, b], found an empty item in '", text, "'");
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// ConfigPlace and the codecs.

std::string ConfigPlace::describe(const YAML::Node& node) const {
  if (!override_text.empty()) return "config " + source + ": override '" + override_text + "'";
  const YAML::Mark mark = node.Mark();
  if (mark.is_null() || mark.line < 0) return "config " + source;
  return "config " + source + ":" + std::to_string(mark.line + 1);
}

// A 32-bit integer field; a larger one is out of range, said as such with the range.
int IntCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  int64_t v = 0;
  if (!n.IsScalar() || !parse_int64(n.Scalar(), v)) type_error(at, n, "an integer");
  if (v < INT_MIN || v > INT_MAX) type_error(at, n, "an integer in [-2147483648, 2147483647]");
  return static_cast<int>(v);
}

int AutoSizeCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  if (n.IsScalar() && n.Scalar() == "auto") return 0;
  int64_t v = 0;
  if (!n.IsScalar() || !parse_int64(n.Scalar(), v)) type_error(at, n, "an integer or auto");
  if (v < INT_MIN || v > INT_MAX) type_error(at, n, "auto or an integer in [-2147483648, 2147483647]");
  return static_cast<int>(v);
}

int64_t Int64Codec::read(const YAML::Node& n, const ConfigPlace& at) {
  int64_t v = 0;
  if (!n.IsScalar() || !parse_int64(n.Scalar(), v))
    type_error(at, n, looks_like_integer(n) ? "an integer in [-2^63, 2^63 - 1]" : "an integer");
  return v;
}

uint64_t Uint64Codec::read(const YAML::Node& n, const ConfigPlace& at) {
  const std::string s = n.IsScalar() ? n.Scalar() : std::string();
  bool digits = !s.empty();
  for (char c : s) digits = digits && c >= '0' && c <= '9';
  errno = 0;
  const unsigned long long v = digits ? std::strtoull(s.c_str(), nullptr, 10) : 0;
  if (!digits || errno == ERANGE) type_error(at, n, "a non-negative integer");
  return v;
}

double DoubleCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  double v = 0;
  if (!n.IsScalar() || !parse_double(n.Scalar(), v)) type_error(at, n, "a number");
  return v;
}

bool BoolCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  bool v = false;
  if (!n.IsScalar() || !parse_bool(n.Scalar(), v)) type_error(at, n, "true or false");
  return v;
}

std::string StringCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  if (!n.IsDefined() || n.IsNull()) return "";  // `load:` with nothing after it means "none"
  if (!n.IsScalar()) type_error(at, n, "a string");
  return n.Scalar();
}

std::vector<std::string> StringListCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  if (!n.IsDefined() || n.IsNull()) return {};
  if (!n.IsSequence()) type_error(at, n, "a list of strings");
  std::vector<std::string> items;
  for (std::size_t k = 0; k < n.size(); ++k) {
    if (!n[k].IsScalar()) type_error(at.at(at.path + "[" + std::to_string(k) + "]"), n[k], "a string");
    items.push_back(n[k].Scalar());
  }
  return items;
}

std::vector<int> IntListCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  if (!n.IsDefined() || n.IsNull()) return {};
  if (!n.IsSequence()) type_error(at, n, "a list of integers");
  std::vector<int> items;
  for (std::size_t k = 0; k < n.size(); ++k) items.push_back(IntCodec::read(n[k], at.at(at.path + "[" + std::to_string(k) + "]")));
  return items;
}

std::vector<double> DoubleListCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  if (!n.IsDefined() || n.IsNull()) return {};
  if (!n.IsSequence()) type_error(at, n, "a list of numbers");
  std::vector<double> items;
  for (std::size_t k = 0; k < n.size(); ++k)
    items.push_back(DoubleCodec::read(n[k], at.at(at.path + "[" + std::to_string(k) + "]")));
  return items;
}

at::ScalarType DtypeCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  const auto dtype = n.IsScalar() ? dtype_parse(n.Scalar()) : std::nullopt;
  if (!dtype) type_error(at, n, "a dtype: fp32, float32, bf16, bfloat16, fp16 or float16");
  return *dtype;
}

nlohmann::json DtypeCodec::write(at::ScalarType value) { return dtype_name(value); }

nlohmann::json JsonMapCodec::read(const YAML::Node& n, const ConfigPlace& at) {
  if (!n.IsDefined() || n.IsNull()) return nlohmann::json::object();
  if (!n.IsMap()) type_error(at, n, "a map");
  return yaml_to_json(n, at);
}

// ---------------------------------------------------------------------------------------------
// ConfigCheck.

std::string ConfigCheck::path(const std::string& key) const { return join_path(section_, key); }

std::string ConfigCheck::where(const std::string& key) const { return "config " + source_ + ": " + path(key); }

void ConfigCheck::invalid(const std::string& key, const std::string& expected, const std::string& found) const {
  fail(where(key), ": expected ", expected, ", found ", found);
}

void ConfigCheck::at_least(const std::string& key, int64_t value, int64_t low) const {
  if (value < low) invalid(key, ">= " + std::to_string(low), std::to_string(value));
}

void ConfigCheck::auto_or_positive(const std::string& key, int value) const {
  if (value < 0) invalid(key, "auto or an integer >= 1", std::to_string(value));
}

void ConfigCheck::one_of(const std::string& key, const std::string& value, const std::vector<std::string>& known) const {
  if (std::find(known.begin(), known.end(), value) == known.end())
    invalid(key, "one of " + join_names(known, "|"), "'" + value + "'");
}

void ConfigCheck::in_unit(const std::string& key, double value, bool include_one) const {
  // Written as !(ok) so that NaN can never pass.
  if (!(value >= 0.0 && (include_one ? value <= 1.0 : value < 1.0)))
    invalid(key, include_one ? "a value in [0, 1]" : "a value in [0, 1)", number(value));
}

void ConfigCheck::module_patterns(const std::string& key, const std::vector<std::string>& patterns) const {
  for (std::size_t i = 0; i < patterns.size(); ++i) {
    try {
      module_pattern_check(patterns[i]);
    } catch (const Error& e) {
      fail(where(key), "[", i, "]: ", e.what());
    }
  }
}

std::string ConfigCheck::number(double value) {
  std::ostringstream s;
  s << value;
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// ConfigSchema.

void ConfigSchema::add_section(const std::string& path) {
  // Every proper prefix is a section too, and each knows its children in declaration order.
  std::string child = path;
  while (!child.empty()) {
    const std::string parent = parent_path(child);
    auto& siblings = children_[parent];
    const std::string name = parent.empty() ? child : child.substr(parent.size() + 1);
    if (std::find(siblings.begin(), siblings.end(), name) == siblings.end()) siblings.push_back(name);
    child = parent;
  }
  children_[path];
}

void ConfigSchema::add_field(Field f) {
  if (field_index_.count(f.path)) fail("config schema: key '", f.path, "' is declared twice");
  add_section(parent_path(f.path));
  auto& siblings = children_[parent_path(f.path)];
  const std::string name = split_path(f.path).back();
  if (std::find(siblings.begin(), siblings.end(), name) == siblings.end()) siblings.push_back(name);
  field_index_[f.path] = fields_.size();
  fields_.push_back(std::move(f));
}

void ConfigSchema::add_derive(const std::string& section, std::function<void(void*, const ConfigCheck&)> fn) {
  derives_.push_back({section, std::move(fn)});
}

void ConfigSchema::add_check(const std::string& section, std::function<void(const void*, const ConfigCheck&)> fn) {
  checks_.push_back({section, [fn](void* root, const ConfigCheck& check) { fn(root, check); }});
}

const ConfigSchema::Field* ConfigSchema::field(const std::string& path) const {
  const auto found = field_index_.find(path);
  return found == field_index_.end() ? nullptr : &fields_[found->second];
}

bool ConfigSchema::has_field(const std::string& path) const { return field(path) != nullptr; }

// segments[bad] is not a key of the section segments[0..bad).
void ConfigSchema::unknown_key(const std::vector<std::string>& segments, std::size_t bad, const std::string& where) const {
  std::string section, full;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    if (i < bad) section = join_path(section, segments[i]);
    full = join_path(full, segments[i]);
  }
  static const std::vector<std::string> none;
  const auto found = children_.find(section);
  const auto& known = found == children_.end() ? none : found->second;
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

void ConfigSchema::read_value(void* root, const std::string& path, const YAML::Node& value, const ConfigPlace& origin,
                              const YAML::Node& key_node) const {
  if (const Field* f = field(path)) {
    f->read(root, value, origin.at(path));
  } else if (is_section(path)) {
    read_section(root, value, path, origin);
  } else {
    const auto segments = split_path(path);
    unknown_key(segments, segments.size() - 1, origin.describe(key_node));
  }
}

// Applies the keys present in map; keys not mentioned keep their current values.
void ConfigSchema::read_section(void* root, const YAML::Node& map, const std::string& section,
                                const ConfigPlace& origin) const {
  const ConfigPlace at = origin.at(section.empty() ? std::string("top level") : section);
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
    read_value(root, path, kv.second, origin, kv.first);
  }
}

void ConfigSchema::apply_override(void* root, const std::string& text, const std::string& source) const {
  const ConfigPlace origin{source, text, ""};
  const YAML::Node nowhere;
  const auto equals = text.find('=');
  const std::string path = trim(text.substr(0, equals));
  if (equals == std::string::npos || path.empty())
    fail(origin.describe(nowhere), ": expected key.path=value, found ",
         equals == std::string::npos ? "no '='" : "no key before '='");
  const YAML::Node value = parse_override_value(text.substr(equals + 1), origin);
  const auto segments = split_path(path);
  for (const auto& segment : segments)
    if (segment.empty())
      fail(origin.describe(nowhere), ": expected a dotted key path, found an empty segment in '", path, "'");

  std::string prefix;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const std::string here = join_path(prefix, segments[i]);
    if (const Field* f = field(here)) {
      if (i + 1 == segments.size()) {
        f->read(root, value, origin.at(here));
        return;
      }
      if (!f->free_form)
        fail(origin.describe(nowhere), ": unknown key '", path, "' ('", here, "' is a single value, not a map)");
      // A key inside a free-form map: create the maps on the way, like the YAML would.
      nlohmann::json* node = &f->free_form(root);
      std::string walked = here;
      for (std::size_t k = i + 1; k < segments.size(); ++k) {
        if (node->is_null()) *node = nlohmann::json::object();
        if (!node->is_object())
          fail(origin.describe(nowhere), ": ", walked, ": expected a map to set '", segments[k], "' in, found ",
               node->dump());
        node = &(*node)[segments[k]];
        walked = join_path(walked, segments[k]);
      }
      *node = yaml_to_json(value, origin.at(path));
      return;
    }
    if (!is_section(here)) unknown_key(segments, i, origin.describe(nowhere));
    prefix = here;
  }
  // The path names a whole section: its value is a map of that section's keys.
  read_section(root, value, path, origin);
}

void ConfigSchema::load(void* root, const std::string& text, const std::string& source,
                        const std::vector<std::string>& overrides) const {
  YAML::Node document;
  try {
    document = YAML::Load(text);
  } catch (const YAML::DeepRecursion& e) {
    // yaml-cpp's own guard (its message is a bare "bad file").
    fail("config ", source, ":", e.mark.line + 1, ":", e.mark.column + 1, ": nested too deeply (more than ",
         e.depth(), " levels of [ ] or { } by here); refused, a real config is a few levels deep");
  } catch (const YAML::ParserException& e) {
    fail("config ", source, ":", e.mark.line + 1, ":", e.mark.column + 1,
         ": expected valid YAML, found a syntax error: ", e.msg);
  }
  check_yaml_bounds(document, source);
  read_section(root, document, "", ConfigPlace{source, "", ""});
  for (const auto& override_text : overrides) apply_override(root, override_text, source);
  for (const auto& step : derives_) step.run(root, ConfigCheck(source, step.section));
  for (const auto& step : checks_) step.run(root, ConfigCheck(source, step.section));
}

nlohmann::json ConfigSchema::to_json(const void* root) const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& f : fields_) {
    nlohmann::json* node = &out;
    for (const auto& segment : split_path(f.path)) node = &(*node)[segment];
    *node = f.write(root);
  }
  return out;
}

nlohmann::json ConfigSchema::value(const void* root, const std::string& path) const {
  const Field* f = field(path);
  if (!f) fail("config schema: '", path, "' is not a config key");
  return f->write(root);
}

}  // namespace mmtrain
