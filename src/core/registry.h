// Registry<Factory>: name -> factory tables for models, datasets and collators, the C++ form of
// MindSpeed's model_register / data_register. add() rejects duplicates; get() on an unknown name
// fails with the known names (and a did-you-mean), so a typo in model.model_id is one clear line.
//
// How entries get in. mmtrain_lib is a STATIC library: the linker only pulls an object file out
// of it when something references one of its symbols, so a model .cpp whose only hook is a
// static registrar object (StaticRegistration below) is silently dropped from the mmtrain binary
// and its name is "unknown" at run time. Recommended pattern: explicit registration functions,
// one per .cpp, called from one idempotent register_builtin_*() that main() and tests call:
//
//   // src/models/model_registry.h
//   using ModelFactory = std::function<std::unique_ptr<Model>(const Config&)>;
//   Registry<ModelFactory>& model_registry();    // function-local static: no init-order problem
//   void register_builtin_models();               // idempotent
//
//   // src/models/magihuman/magihuman.cpp
//   void register_magihuman(Registry<ModelFactory>& registry) {
//     registry.add("magihuman", [](const Config& config) { return build_magihuman(config); });
//   }
//
//   // src/models/model_registry.cpp
//   Registry<ModelFactory>& model_registry() {
//     static Registry<ModelFactory> registry("model");
//     return registry;
//   }
//   void register_builtin_models() {
//     static std::once_flag once;   // main() and every test may call it
//     std::call_once(once, [] {
//       register_magihuman(model_registry());
//       register_test_transformer(model_registry());
//     });
//   }
//
// The explicit list is the one place that names every built-in, and forgetting an entry fails
// loudly (unknown model) instead of depending on link order. StaticRegistration is still given
// for code linked as object files (test executables, a future OBJECT library or
// --whole-archive link), where static initialisers are guaranteed to run.
#pragma once
#include "core/error.h"
#include "core/suggest.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

// Not thread-safe: registration happens once at start-up, before any worker thread exists.
template <typename Factory>
class Registry {
 public:
  // kind names the table in messages: "model", "dataset", "collator".
  explicit Registry(std::string kind) : kind_(std::move(kind)) {}

  void add(const std::string& name, Factory factory) {
    if (name.empty()) fail(kind_, " registry: expected a non-empty name, found an empty one");
    if (entries_.count(name))
      fail(kind_, " registry: expected each name once, found '", name, "' registered twice");
    entries_.emplace(name, std::move(factory));
  }

  bool contains(const std::string& name) const { return entries_.count(name) != 0; }

  // where, when given, says where the name came from ("config a.yaml: model.model_id") and
  // starts the message.
  const Factory& get(const std::string& name, const std::string& where = "") const {
    const auto found = entries_.find(name);
    if (found != entries_.end()) return found->second;
    const auto known = names();
    const std::string suggestion = closest_name(name, known);
    fail(where.empty() ? std::string() : where + ": ", "unknown ", kind_, " '", name, "'",
         suggestion.empty() ? std::string() : " (did you mean '" + suggestion + "'?)", "; known ", kind_,
         " names: ", known.empty() ? std::string("(none registered)") : join_names(known));
  }

  // Sorted, for stable messages and listings.
  std::vector<std::string> names() const {
    std::vector<std::string> sorted;
    sorted.reserve(entries_.size());
    for (const auto& entry : entries_) sorted.push_back(entry.first);
    return sorted;
  }

  const std::string& kind() const { return kind_; }

 private:
  std::string kind_;
  std::map<std::string, Factory> entries_;
};

// Registers at static-initialisation time: `static StaticRegistration<F> reg(model_registry(),
// "name", factory);` at namespace scope. Only for objects that are certainly linked (see the
// file comment); library code should use an explicit register_* function instead.
template <typename Factory>
struct StaticRegistration {
  StaticRegistration(Registry<Factory>& registry, const std::string& name, Factory factory) {
    registry.add(name, std::move(factory));
  }
};

}  // namespace mmtrain
