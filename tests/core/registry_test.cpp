// Registry: add/get, duplicate and unknown-name errors with the known names and a did-you-mean,
// static registrars, and the built-ins that register themselves from their folders.
#include "core/registry.h"

#include "core/cli_command.h"
#include "core/suggest.h"
#include "data/dataset.h"
#include "models/model_spec.h"

#include "test_util.h"

#include <gtest/gtest.h>

#include <functional>

namespace mmtrain {
namespace {

using Factory = std::function<int(int)>;

using mmtrain::testing::error_of;

TEST(RegistryTest, AddGetNames) {
  Registry<Factory> registry("model");
  registry.add("test_transformer", [](int x) { return x + 1; });
  registry.add("magihuman", [](int x) { return x * 2; });
  EXPECT_EQ(registry.get("magihuman")(21), 42);
  EXPECT_EQ(registry.get("test_transformer")(1), 2);
  EXPECT_TRUE(registry.contains("magihuman"));
  EXPECT_FALSE(registry.contains("magistral"));
  EXPECT_EQ(registry.names(), (std::vector<std::string>{"magihuman", "test_transformer"}));
  EXPECT_EQ(registry.kind(), "model");
}

TEST(RegistryTest, DuplicateAndUnknownNamesAreErrors) {
  Registry<Factory> registry("dataset");
  registry.add("magihuman_precomputed", [](int x) { return x; });
  EXPECT_CONTAINS(error_of([&] { registry.add("magihuman_precomputed", [](int x) { return x; }); }),
                  "dataset registry: expected each name once, found 'magihuman_precomputed' registered twice");
  EXPECT_CONTAINS(error_of([&] { registry.add("", [](int x) { return x; }); }), "expected a non-empty name");
  registry.add("synthetic", [](int x) { return x; });

  std::string message = error_of([&] { registry.get("magihuman_precomputd", "config a.yaml: data.dataset_param.dataset_type"); });
  EXPECT_CONTAINS(message, "config a.yaml: data.dataset_param.dataset_type: unknown dataset 'magihuman_precomputd' "
                           "(did you mean 'magihuman_precomputed'?); known dataset names: magihuman_precomputed, synthetic");
  message = error_of([&] { registry.get("webdataset"); });
  EXPECT_CONTAINS(message, "unknown dataset 'webdataset'; known dataset names: magihuman_precomputed, synthetic");

  Registry<Factory> empty("collator");
  EXPECT_CONTAINS(error_of([&] { empty.get("x"); }), "known collator names: (none registered)");
}

// Every built-in registers itself from its own folder (registry.h): nothing names them in a
// list, so this fails if an object file stops being linked (a STATIC library would drop them).
// Presence, not the exact list: adding a model breaks no test.
TEST(RegistryTest, BuiltinsRegisterThemselves) {
  for (const char* name : {"magihuman", "mistral3", "test_transformer"})
    EXPECT_TRUE(model_spec_registry().contains(name)) << name;
  for (const char* name : {"huggingface", "magihuman_precomputed", "token_file"})
    EXPECT_TRUE(dataset_registry().contains(name)) << name;
  for (const char* name : {"causal_lm", "magihuman", "pixtral"}) EXPECT_TRUE(collator_registry().contains(name)) << name;
  for (const char* name : {"magihuman", "mistral3", "tokens"}) EXPECT_TRUE(fixture_registry().contains(name)) << name;
}

// A static registrar in a linked object file runs before main.
Registry<Factory>& static_registry() {
  static Registry<Factory> registry("static");
  return registry;
}
const StaticRegistration<Factory> register_negate(static_registry(), "negate", [](int x) { return -x; });

TEST(RegistryTest, StaticRegistrationRunsBeforeMain) { EXPECT_EQ(static_registry().get("negate")(5), -5); }

TEST(SuggestTest, EditDistanceAndClosestName) {
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("lrr", "lr"), 1u);
  EXPECT_EQ(edit_distance("dtpye", "dtype"), 1u);  // adjacent swap costs 1
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(closest_name("lrr", {"lr_min", "lr", "seed"}), "lr");
  EXPECT_EQ(closest_name("tools", {"parallel", "model", "data"}), "");
  EXPECT_EQ(closest_name("x", {"lr"}), "");  // two edits for a one-letter key is no typo
}

}  // namespace
}  // namespace mmtrain
