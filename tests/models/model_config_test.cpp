// Every size in a model's config is checked before any arithmetic uses it: a 0 head count, head
// dim or width is an error naming the key, never a division by zero (SIGFPE) or an empty model.
#include "models/model_spec.h"
#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace mmtrain {
namespace {

struct ModelSizes {
  std::string model;
  nlohmann::json config;           // a valid tiny config
  std::vector<std::string> sizes;  // JSON pointers to the sizes set to 0 one at a time
};

const std::vector<ModelSizes> kModels = {
    {"test_transformer",
     {{"vocab_size", 64}, {"hidden_size", 32}, {"num_layers", 2}, {"num_heads", 4}, {"num_kv_heads", 2}, {"ffn_hidden_size", 64}},
     {"/vocab_size", "/hidden_size", "/num_layers", "/num_heads", "/num_kv_heads", "/ffn_hidden_size"}},
    {"magihuman",
     {{"num_layers", 2}, {"hidden_size", 64}, {"head_dim", 16}, {"num_query_groups", 2}, {"video_in_channels", 16},
      {"audio_in_channels", 8}, {"text_in_channels", 24}, {"mm_layers", {0}}, {"gelu7_layers", {0}}},
     {"/num_layers", "/hidden_size", "/head_dim", "/num_query_groups", "/video_in_channels", "/audio_in_channels",
      "/text_in_channels"}},
    {"mistral3",
     {{"image_token_index", 10},
      {"spatial_merge_size", 2},
      {"text_config", {{"vocab_size", 288}, {"hidden_size", 64}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
                       {"num_key_value_heads", 2}, {"head_dim", 24}, {"intermediate_size", 128}}},
      {"vision_config", {{"hidden_size", 32}, {"num_hidden_layers", 2}, {"num_attention_heads", 2},
                         {"intermediate_size", 64}, {"patch_size", 4}, {"image_size", 32}}}},
     {"/spatial_merge_size", "/text_config/vocab_size", "/text_config/hidden_size", "/text_config/num_hidden_layers",
      "/text_config/num_attention_heads", "/text_config/num_key_value_heads", "/text_config/head_dim",
      "/text_config/intermediate_size", "/vision_config/hidden_size", "/vision_config/num_hidden_layers",
      "/vision_config/num_attention_heads", "/vision_config/intermediate_size", "/vision_config/patch_size",
      "/vision_config/image_size"}},
};

TEST(ModelConfig, ZeroSizesAreErrorsNamingTheKey) {
  for (const auto& m : kModels) {
    const auto& spec = model_spec(m.model);
    ASSERT_NO_THROW(spec.build(m.config)) << m.model;
    for (const auto& pointer : m.sizes) {
      auto config = m.config;
      config[nlohmann::json::json_pointer(pointer)] = 0;
      std::string key = pointer.substr(1);
      for (auto& c : key)
        if (c == '/') c = '.';
      const auto message = testing::error_of([&] { spec.build(config); });
      EXPECT_CONTAINS(message, "model.config." + key) << m.model;
      EXPECT_CONTAINS(message, "must be >= 1, got 0") << m.model;
    }
  }
}

// The three config readers share core/param_map: an unknown key is refused with a did-you-mean,
// a wrong type names the key and what it expected.
TEST(ModelConfig, UnknownKeysAndWrongTypesAreNamed) {
  const std::pair<std::string, std::string> typos[] = {
      {"test_transformer", "/num_head"}, {"magihuman", "/num_layer"}, {"mistral3", "/text_config/vocab_sise"}};
  for (const auto& m : kModels)
    for (const auto& [model, pointer] : typos) {
      if (model != m.model) continue;
      auto config = m.config;
      config[nlohmann::json::json_pointer(pointer)] = 1;
      const auto message = testing::error_of([&] { model_spec(m.model).build(config); });
      EXPECT_CONTAINS(message, "unknown key for " + m.model + " (did you mean '") << message;
    }
  auto magihuman = kModels[1].config;
  magihuman["mm_layers"] = "all";
  EXPECT_CONTAINS(testing::error_of([&] { model_spec("magihuman").build(magihuman); }),
                  "model.config.mm_layers: expected a list of integers, found \"all\"");
  auto mistral3 = kModels[2].config;
  mistral3["text_config"]["hidden_size"] = 64.5;
  EXPECT_CONTAINS(testing::error_of([&] { model_spec("mistral3").build(mistral3); }),
                  "model.config.text_config.hidden_size: expected an integer, found 64.5");
}

}  // namespace
}  // namespace mmtrain
