// The generic YAML config reader. A ConfigSchema is a tree of sections whose fields are bound
// to the members of plain structs; each component declares its own section next to the struct
// it reads (FsdpConfig's in fsdp/fsdp_config.cpp, TrainingConfig's in config/training_config.cpp,
// ...), and the run config (config/config.cpp) mounts them under their YAML paths. From that one
// declaration the schema reads a YAML file into the struct, applies "a.b.c=value" overrides,
// reports unknown keys (with a did-you-mean) and wrong types naming the key path, the file and
// the line, runs each section's checks once everything is applied, and writes the struct back as
// JSON in the YAML layout. Reading, overrides, unknown-key detection and JSON output therefore
// cannot disagree about which keys exist.
//
//   void FsdpConfig::declare(ConfigSection<FsdpConfig>& s) {
//     s.field("apply_modules", &FsdpConfig::apply_modules);
//     s.field("param_dtype", &FsdpConfig::param_dtype);
//     s.check([](const FsdpConfig& c, const ConfigCheck& check) {
//       check.at_least("num_to_forward_prefetch", c.num_to_forward_prefetch, 0);
//     });
//   }
//
// Scalars follow the YAML 1.2 core schema (docs/config.md): true/false in three casings, decimal
// integers, decimal floats with an optional exponent ("1e-5" is a number). yaml-cpp stays inside
// config_schema.cpp; this header only names YAML::Node.
#pragma once
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace YAML {
class Node;
}

namespace mmtrain {

// Where a value was read: file, override text, full key path. Errors start with describe().
struct ConfigPlace {
  std::string source;         // the config file (or the name given for YAML text)
  std::string override_text;  // "training.lr=3e-4" for an override, empty for the file
  std::string path;           // "training.lr", "parallel.fsdp_plan.apply_modules[2]"
  // "config a.yaml:12" (the node's line), "config a.yaml" or "config a.yaml: override 'k=v'".
  std::string describe(const YAML::Node& node) const;
  ConfigPlace at(const std::string& sub_path) const { return {source, override_text, sub_path}; }
};

// Value codecs: how one field type is read from YAML (type errors name the key) and written to
// JSON in the YAML layout.
struct IntCodec {
  static int read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(int value) { return value; }
};
// A size MindSpeed lets the world size decide: "auto" is stored as 0.
struct AutoSizeCodec {
  static int read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(int value) { return value == 0 ? nlohmann::json("auto") : nlohmann::json(value); }
};
struct Int64Codec {
  static int64_t read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(int64_t value) { return value; }
};
struct Uint64Codec {
  static uint64_t read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(uint64_t value) { return value; }
};
struct DoubleCodec {
  static double read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(double value) { return value; }
};
struct BoolCodec {
  static bool read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(bool value) { return value; }
};
// Any scalar as text; an empty value (`load:`) or `~` is "".
struct StringCodec {
  static std::string read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(const std::string& value) { return value; }
};
struct StringListCodec {
  static std::vector<std::string> read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(const std::vector<std::string>& value) { return value; }
};
struct IntListCodec {
  static std::vector<int> read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(const std::vector<int>& value) { return value; }
};
struct DoubleListCodec {
  static std::vector<double> read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(const std::vector<double>& value) { return value; }
};
// fp32|float32|bf16|bfloat16|fp16|float16, written back as fp32 / bf16 / fp16.
struct DtypeCodec {
  static at::ScalarType read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(at::ScalarType value);
};
// A free-form map (model.config, data.dataset_param): YAML's own typing, checked by its consumer.
struct JsonMapCodec {
  static nlohmann::json read(const YAML::Node& node, const ConfigPlace& at);
  static nlohmann::json write(const nlohmann::json& value) { return value; }
};

template <typename T>
struct DefaultCodec;
template <> struct DefaultCodec<int> { using type = IntCodec; };
template <> struct DefaultCodec<int64_t> { using type = Int64Codec; };
template <> struct DefaultCodec<uint64_t> { using type = Uint64Codec; };
template <> struct DefaultCodec<double> { using type = DoubleCodec; };
template <> struct DefaultCodec<bool> { using type = BoolCodec; };
template <> struct DefaultCodec<std::string> { using type = StringCodec; };
template <> struct DefaultCodec<std::vector<std::string>> { using type = StringListCodec; };
template <> struct DefaultCodec<std::vector<int>> { using type = IntListCodec; };
template <> struct DefaultCodec<std::vector<double>> { using type = DoubleListCodec; };
template <> struct DefaultCodec<at::ScalarType> { using type = DtypeCodec; };
template <> struct DefaultCodec<nlohmann::json> { using type = JsonMapCodec; };

// What a section's checks and derivations use to fail: every message reads
// "config <file>: <section>.<key>: expected <what>, found <what>".
class ConfigCheck {
 public:
  ConfigCheck(std::string source, std::string section) : source_(std::move(source)), section_(std::move(section)) {}
  // "config foo.yaml: training.lr" for key "lr" of section "training".
  std::string where(const std::string& key) const;
  std::string path(const std::string& key) const;  // "training.lr"
  [[noreturn]] void invalid(const std::string& key, const std::string& expected, const std::string& found) const;
  void at_least(const std::string& key, int64_t value, int64_t low) const;
  void auto_or_positive(const std::string& key, int value) const;  // 0 means auto
  void one_of(const std::string& key, const std::string& value, const std::vector<std::string>& known) const;
  // value in [0, 1] (include_one) or [0, 1); NaN never passes.
  void in_unit(const std::string& key, double value, bool include_one) const;
  // Module-pattern syntax of every item (core/module_pattern.h); whether each matches a module
  // needs the model and is checked where the plan is applied.
  void module_patterns(const std::string& key, const std::vector<std::string>& patterns) const;
  // Shortest round-trip text of a number, for messages ("1e-05", "0.0001").
  static std::string number(double value);

 private:
  std::string source_;
  std::string section_;
};

class ConfigSchema;

// The fields of one section (one YAML map), bound to members of S. The section holds no data of
// its own: it registers into the schema, so it may be a temporary.
template <typename S>
class ConfigSection {
 public:
  // A field read with T's default codec (or Codec, e.g. AutoSizeCodec). Registration order is
  // the order of "known keys" lists.
  template <typename T, typename Codec = typename DefaultCodec<T>::type>
  ConfigSection& field(const std::string& key, T S::*member, Codec = {});
  // A nested section (a YAML map inside this one) whose fields member's type declares.
  template <typename C>
  ConfigSection& section(const std::string& key, C S::*member, void (*declare)(ConfigSection<C>&));
  // A sub-map of this section whose keys are fields of S itself (e.g. features.loss_cfg.loss_type
  // stored as FeaturesConfig::loss_type): declare adds them through the returned section.
  ConfigSection<S> map(const std::string& key);
  // Runs after the file and every override are applied, in declaration order, before checks:
  // for values derived from others (data.dataset_type from data.dataset_param).
  ConfigSection& derive(std::function<void(S&, const ConfigCheck&)> fn);
  // Runs once everything is applied and derived; fails through the ConfigCheck.
  ConfigSection& check(std::function<void(const S&, const ConfigCheck&)> fn);

 private:
  friend class ConfigSchema;
  template <typename>
  friend class ConfigSection;
  ConfigSection(ConfigSchema& schema, std::string path, std::function<S*(void*)> get)
      : schema_(schema), path_(std::move(path)), get_(std::move(get)) {}
  std::string join(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  ConfigSchema& schema_;
  std::string path_;               // "" for the root
  std::function<S*(void*)> get_;   // the root struct -> this section's struct
};

// The whole tree. Built once (config/config.cpp), then used to read any number of files.
class ConfigSchema {
 public:
  // The root section, bound to Root (the struct load() fills).
  template <typename Root>
  ConfigSection<Root> root() {
    return ConfigSection<Root>(*this, "", [](void* r) { return static_cast<Root*>(r); });
  }

  // Applies YAML text onto *root (which holds the defaults), then every override in order, then
  // the derivations and checks. source names the file in messages.
  void load(void* root, const std::string& text, const std::string& source,
            const std::vector<std::string>& overrides) const;
  // The effective values in the YAML layout (free-form maps in full).
  nlohmann::json to_json(const void* root) const;
  // One field's value as to_json writes it; fails for a path that is not a field.
  nlohmann::json value(const void* root, const std::string& path) const;
  bool has_field(const std::string& path) const;

  // Registration (ConfigSection calls these).
  struct Field {
    std::string path;
    std::function<void(void* root, const YAML::Node&, const ConfigPlace&)> read;
    std::function<nlohmann::json(const void* root)> write;
    // Set for free-form maps: an override may set a key inside them ("model.config.hidden_size=64").
    std::function<nlohmann::json&(void* root)> free_form;
  };
  void add_field(Field field);
  void add_section(const std::string& path);
  void add_derive(const std::string& section, std::function<void(void* root, const ConfigCheck&)> fn);
  void add_check(const std::string& section, std::function<void(const void* root, const ConfigCheck&)> fn);

 private:
  void read_section(void* root, const YAML::Node& map, const std::string& section, const ConfigPlace& origin) const;
  void read_value(void* root, const std::string& path, const YAML::Node& value, const ConfigPlace& origin,
                  const YAML::Node& key_node) const;
  void apply_override(void* root, const std::string& text, const std::string& source) const;
  [[noreturn]] void unknown_key(const std::vector<std::string>& segments, size_t bad, const std::string& where) const;
  const Field* field(const std::string& path) const;
  bool is_section(const std::string& path) const { return children_.count(path) != 0; }

  struct Step {
    std::string section;
    std::function<void(void* root, const ConfigCheck&)> run;
  };
  std::vector<Field> fields_;                                  // declaration order
  std::map<std::string, size_t> field_index_;
  std::map<std::string, std::vector<std::string>> children_;   // section -> child keys, in order
  std::vector<Step> derives_;
  std::vector<Step> checks_;
};

// ----------------------------------------------------------------------------------------------
// ConfigSection's templates: each binds a member pointer into type-erased schema entries.

template <typename S>
template <typename T, typename Codec>
ConfigSection<S>& ConfigSection<S>::field(const std::string& key, T S::*member, Codec) {
  ConfigSchema::Field f;
  f.path = join(key);
  auto get = get_;
  f.read = [get, member](void* root, const YAML::Node& node, const ConfigPlace& at) {
    get(root)->*member = Codec::read(node, at);
  };
  f.write = [get, member](const void* root) { return Codec::write(get(const_cast<void*>(root))->*member); };
  if constexpr (std::is_same_v<T, nlohmann::json>)
    f.free_form = [get, member](void* root) -> nlohmann::json& { return get(root)->*member; };
  schema_.add_field(std::move(f));
  return *this;
}

template <typename S>
template <typename C>
ConfigSection<S>& ConfigSection<S>::section(const std::string& key, C S::*member,
                                            void (*declare)(ConfigSection<C>&)) {
  auto get = get_;
  ConfigSection<C> child(schema_, join(key), [get, member](void* root) { return &(get(root)->*member); });
  schema_.add_section(child.path_);
  declare(child);
  return *this;
}

template <typename S>
ConfigSection<S> ConfigSection<S>::map(const std::string& key) {
  ConfigSection<S> sub(schema_, join(key), get_);
  schema_.add_section(sub.path_);
  return sub;
}

template <typename S>
ConfigSection<S>& ConfigSection<S>::derive(std::function<void(S&, const ConfigCheck&)> fn) {
  auto get = get_;
  schema_.add_derive(path_, [get, fn](void* root, const ConfigCheck& check) { fn(*get(root), check); });
  return *this;
}

template <typename S>
ConfigSection<S>& ConfigSection<S>::check(std::function<void(const S&, const ConfigCheck&)> fn) {
  auto get = get_;
  schema_.add_check(path_, [get, fn](const void* root, const ConfigCheck& check) {
    fn(*get(const_cast<void*>(root)), check);
  });
  return *this;
}

}  // namespace mmtrain
