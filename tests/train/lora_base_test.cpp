// train/lora_base.h: what a LoRA checkpoint records of its adapters and base, and the sentences
// that refuse a difference (issue 55, items 1 and 2).
#include "train/lora_base.h"

#include "nn/lora.h"
#include "test_util.h"

#include <gtest/gtest.h>

namespace mmtrain {
namespace {

TEST(LoraBase, EveryKeyThatChangesTheModelIsComparedAndNamedWithBothValues) {
  LoraConfig trained;
  trained.rank = 4;
  trained.alpha = 16;
  trained.modules_to_save = {"lm_head"};
  const auto saved = lora_adapters(trained);
  EXPECT_EQ(lora_adapters_difference(saved, saved), "");
  LoraConfig dtype_only = trained;
  dtype_only.adapter_dtype = at::kBFloat16;  // a compute choice, like param_dtype
  EXPECT_EQ(lora_adapters_difference(saved, lora_adapters(dtype_only)), "");
  auto differs = [&](const std::function<void(LoraConfig&)>& change) {
    LoraConfig now = trained;
    change(now);
    return lora_adapters_difference(saved, lora_adapters(now));
  };
  EXPECT_CONTAINS(differs([](LoraConfig& c) { c.alpha = 64; }),
                  "features.lora.alpha is 64.0 in this config, and the checkpoint's adapters were trained with 16.0");
  EXPECT_CONTAINS(differs([](LoraConfig& c) { c.use_rslora = true; }), "features.lora.use_rslora is true");
  EXPECT_CONTAINS(differs([](LoraConfig& c) { c.rank = 8; }), "features.lora.rank is 8");
  EXPECT_CONTAINS(differs([](LoraConfig& c) { c.modules_to_save.clear(); }),
                  "features.lora.modules_to_save is [] in this config, and the checkpoint's adapters were trained with [\"lm_head\"]");
  EXPECT_CONTAINS(differs([](LoraConfig& c) { c.target_modules = {"layers.{*}.attn.wq"}; }), "features.lora.target_modules");
  // A checkpoint from before the adapters were recorded: its config's features.lora, defaults for what it leaves out.
  const nlohmann::json old_state = {{"lora_base", {{"init_seed", 5}}},
                                    {"config", {{"features", {{"lora", {{"rank", 4}, {"alpha", 16}, {"modules_to_save", {"lm_head"}}}}}}}}};
  EXPECT_EQ(lora_adapters_difference(lora_adapters_of_checkpoint(old_state), saved), "");
}

TEST(LoraBase, ABaseIsTheSameOnlyByItsFingerprintOfEveryByte) {
  const nlohmann::json saved = {{"weights", "/m"}, {"fingerprint", "0000abcd"}, {"fingerprint_of", "sha256 of every byte"}};
  nlohmann::json moved = saved;
  moved["weights"] = "/elsewhere";
  EXPECT_EQ(lora_base_difference(saved, moved), "");  // where it is does not matter, what it holds does
  nlohmann::json other = saved;
  other["fingerprint"] = "0000abce";
  EXPECT_CONTAINS(lora_base_difference(saved, other), "its adapters were trained over weights /m (fingerprint 0000abcd)");
  nlohmann::json older = saved;
  older.erase("fingerprint_of");
  EXPECT_CONTAINS(lora_base_difference(older, saved), "taken by an older mmtrain (over the first row of each tensor)");
  older["fingerprint_of"] = "crc32c of every byte";  // issue 65: a CRC a substituted base can be made to match
  EXPECT_CONTAINS(lora_base_difference(older, saved), "taken by an older mmtrain (crc32c of every byte)");
  EXPECT_EQ(lora_base_difference({{"init_seed", 5}}, {{"init_seed", 5}}), "");
  EXPECT_CONTAINS(lora_base_difference({{"init_seed", 5}}, {{"init_seed", 6}}), "a random init with seed 6");
  EXPECT_CONTAINS(lora_base_difference({{"init_seed", 5}}, saved), "a random init with seed 5");
  EXPECT_CONTAINS(lora_base_difference(nlohmann::json("x"), saved), "is not {\"weights\", \"fingerprint\"}");
}

}  // namespace
}  // namespace mmtrain
