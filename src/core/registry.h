// Registry<Entry>: name -> entry tables (model specs, datasets, collators, fixtures), the C++
// form of MindSpeed's model_register / data_register. add() rejects duplicates; get() on an
// unknown name fails with the known names (and a did-you-mean), so a typo in model.model_id is
// one clear line.
//
// How entries get in: each component registers itself at static initialisation, from its own
// folder, with a registrar object at namespace scope:
//
//   // src/models/<name>/spec.cpp
//   const ModelSpecRegistration registration(my_model_spec());
//
// The registries are function-local statics, so there is no initialisation-order problem. This
// relies on every object file being linked: mmtrain's sources are built as a CMake OBJECT library
// for exactly that reason (a STATIC library lets the linker drop an object file nothing
// references, and its registration with it). No list anywhere names the built-ins.
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

// Registers at static-initialisation time: `const StaticRegistration<F> reg(registry(), "name",
// entry);` at namespace scope (see the file comment for why that is reliable here).
template <typename Factory>
struct StaticRegistration {
  StaticRegistration(Registry<Factory>& registry, const std::string& name, Factory factory) {
    registry.add(name, std::move(factory));
  }
};

}  // namespace mmtrain
