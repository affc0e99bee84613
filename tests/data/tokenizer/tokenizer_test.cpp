// Tokenizer core on hand-made tiny vocabularies: tiktoken's rank-merge order (lowest rank,
// leftmost on ties), vocab truncation, the special-id offset, control-token look-alikes staying
// text, default special tokens of old tekken files, HF merges/added tokens/fix_mistral_regex,
// the regex rewrite and lossy UTF-8 decode, and each load error naming what it expected.
// Parity with mistral-common and HF tokenizers on real files: tests/parity/test_tokenizer_parity.py.
#include "data/tokenizer/byte_bpe.h"
#include "data/tokenizer/hf_bpe.h"
#include "data/tokenizer/tekken.h"

#include "checkpoint/checkpoint_test_util.h"
#include "core/error.h"

#include "test_util.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>

namespace mmtrain::tokenizer {
namespace {


using mmtrain::testing::error_of;


void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// Ranks 0..255 are the bytes; then "ab" 256, "bc" 257, "abc" 258, "cd" 259.
nlohmann::json tiny_tekken(bool with_specials = true, const std::string& version = "v13") {
  nlohmann::json vocab = nlohmann::json::array();
  for (int b = 0; b < 256; ++b) {
    vocab.push_back({{"rank", b}, {"token_bytes", base64_encode(std::string(1, static_cast<char>(b)))}, {"token_str", nullptr}});
  }
  int rank = 256;
  for (const char* merged : {"ab", "bc", "abc", "cd"}) {
    vocab.push_back({{"rank", rank++}, {"token_bytes", base64_encode(merged)}, {"token_str", merged}});
  }
  nlohmann::json file = {{"config",
                          {{"pattern", kTekkenPattern},
                           {"num_vocab_tokens", 260},
                           {"default_vocab_size", 24 + 260},
                           {"default_num_special_tokens", 24},
                           {"version", version}}},
                         {"vocab", vocab}};
  if (with_specials) {
    nlohmann::json specials = nlohmann::json::array();
    int id = 0;
    for (const char* name : {"<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]"}) {
      specials.push_back({{"rank", id++}, {"token_str", name}, {"is_control", true}});
    }
    file["special_tokens"] = specials;
  }
  return file;
}

TEST(TekkenTokenizer, MergesLowestRankFirstAndLeftmostOnTies) {
  testing::TempDir dir;
  write(dir / "tekken.json", tiny_tekken().dump());
  const auto tok = TekkenTokenizer::load(dir / "tekken.json");
  EXPECT_EQ(tok.num_special(), 24);
  // "abcd": ab(256) < bc(257) < cd(259) -> [ab, c, d] -> abc(258) < cd -> [abc, d].
  EXPECT_EQ(tok.encode("abcd"), (std::vector<int32_t>{24 + 258, 24 + 'd'}));
  // "abab": two ab pairs tie; the leftmost merges first, then the right one.
  EXPECT_EQ(tok.encode("abab"), (std::vector<int32_t>{24 + 256, 24 + 256}));
  // A whole piece found in the ranks is one token without merging.
  EXPECT_EQ(tok.encode("cd"), (std::vector<int32_t>{24 + 259}));
  // The pattern splits "ab cd" into "ab" and " cd"; " cd" has no " c" rank: " " + cd.
  EXPECT_EQ(tok.encode("ab cd"), (std::vector<int32_t>{24 + 256, 24 + ' ', 24 + 259}));
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(TekkenTokenizer, VocabSizeTruncatesRanks) {
  testing::TempDir dir;
  write(dir / "tekken.json", tiny_tekken().dump());
  TekkenOptions options;
  options.vocab_size = 24 + 258;  // keeps ab, bc; drops abc, cd
  const auto tok = TekkenTokenizer::load(dir / "tekken.json", options);
  EXPECT_EQ(tok.vocab_size(), 24 + 258);
  EXPECT_EQ(tok.encode("abcd"), (std::vector<int32_t>{24 + 256, 24 + 'c', 24 + 'd'}));
  EXPECT_CONTAINS(error_of([&] { tok.token_bytes(24 + 258); }), "expected a token id in [0, 282), found 282");
}

TEST(TekkenTokenizer, ControlTokensOnlyById) {
  testing::TempDir dir;
  write(dir / "tekken.json", tiny_tekken().dump());
  const auto tok = TekkenTokenizer::load(dir / "tekken.json");
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.special_id("[INST]"), 3);
  EXPECT_EQ(tok.special_id("[IMG]"), 5);
  EXPECT_EQ(tok.special_id("<SPECIAL_23>"), 23);  // filler up to default_num_special_tokens
  // User text that looks like a control token is ordinary bytes.
  const auto ids = tok.encode("[INST]</s>");
  for (const int32_t id : ids) EXPECT_GE(id, tok.num_special());
  EXPECT_EQ(tok.decode(ids), "[INST]</s>");
  EXPECT_CONTAINS(error_of([&] { tok.special_id("[IMG_BREAK]"); }), "expected a special token named '[IMG_BREAK]'");
}

TEST(TekkenTokenizer, DecodeSkipsOrKeepsSpecialsAndReplacesBrokenUtf8) {
  testing::TempDir dir;
  write(dir / "tekken.json", tiny_tekken().dump());
  const auto tok = TekkenTokenizer::load(dir / "tekken.json");
  const std::string text = "abcd é 日本\n\t  x";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
  auto ids = tok.encode("ab");
  ids.insert(ids.begin(), tok.bos_id());
  ids.push_back(tok.eos_id());
  EXPECT_EQ(tok.decode(ids), "ab");
  EXPECT_EQ(tok.decode(ids, /*keep_special=*/true), "<s>ab</s>");
  // "é" is two byte tokens; a special id between them breaks the character, as in mistral-common.
  const int32_t c3 = 24 + 0xC3, a9 = 24 + 0xA9;
  EXPECT_EQ(tok.decode({c3, a9}), "é");
  EXPECT_EQ(tok.decode({c3, 1, a9}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_CONTAINS(error_of([&] { tok.encode(std::string("a\xFF")); }), "invalid byte at offset 1");
}

TEST(TekkenTokenizer, OldFilesUseTheDefaultSpecialTokens) {
  testing::TempDir dir;
  write(dir / "v3.json", tiny_tekken(false, "v3").dump());
  const auto tok = TekkenTokenizer::load(dir / "v3.json");
  EXPECT_EQ(tok.special_id("[INST]"), 3);
  EXPECT_EQ(tok.special_id("[IMG]"), 10);
  EXPECT_EQ(tok.special_id("[IMG_BREAK]"), 12);
  EXPECT_EQ(tok.special_id("[IMG_END]"), 13);
  EXPECT_EQ(tok.special_id("[SYSTEM_PROMPT]"), 17);
  EXPECT_EQ(tok.special_id("[/SYSTEM_PROMPT]"), 18);
  EXPECT_EQ(tok.special_id("<SPECIAL_20>"), 20);
  write(dir / "v13.json", tiny_tekken(false, "v13").dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "v13.json"); }), "expected a special_tokens list");
}

TEST(TekkenTokenizer, LoadErrorsSayWhatAndWhere) {
  testing::TempDir dir;
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "absent.json"); }), "absent.json: no such file");
  write(dir / "bad.json", "{\"config\": {");
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "bad.json"); }), "bad.json: not valid JSON");
  auto file = tiny_tekken();
  file["config"].erase("pattern");
  write(dir / "nopattern.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "nopattern.json"); }), "config: expected key 'pattern'");
  file = tiny_tekken();
  file["vocab"][257]["rank"] = 3;
  write(dir / "rank.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "rank.json"); }), "vocab[257]: expected rank 257, found 3");
  file = tiny_tekken();
  file["vocab"][65]["token_bytes"] = base64_encode("B");
  write(dir / "byte.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "byte.json"); }), "vocab[65]: expected the single byte 65");
  file = tiny_tekken();
  file["config"]["default_vocab_size"] = 24 + 261;
  write(dir / "size.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "size.json"); }), "vocab_size <= len(vocab) + num_special_tokens");
  file = tiny_tekken();
  file["config"]["pattern"] = "(unclosed";
  write(dir / "regex.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "regex.json"); }), "expected a pre-tokenizer regex PCRE2 can compile");
  file = tiny_tekken();
  file["special_tokens"][4]["token_str"] = "[INST]";
  write(dir / "dup.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { TekkenTokenizer::load(dir / "dup.json"); }), "expected unique special token names, found '[INST]'");
}

// Byte-level HF tokenizer.json: the 256 byte chars are ids 0..255, "ab" 256, "bc" 257,
// "abc" 258, "Ġa" 259; merges (a b) < (b c) < (ab c) < (Ġ a); added <s> 300, [INST] 301.
nlohmann::json tiny_hf() {
  const auto& chars = byte_level_chars();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  vocab["ab"] = 256, vocab["bc"] = 257, vocab["abc"] = 258, vocab[chars[' '] + "a"] = 259;
  return {{"version", "1.0"},
          {"normalizer", nullptr},
          {"added_tokens",
           {{{"id", 300}, {"content", "<s>"}, {"special", true}, {"normalized", false}},
            {{"id", 301}, {"content", "[INST]"}, {"special", true}, {"normalized", false}}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Split"}, {"pattern", {{"Regex", R"(\p{L}+|\s+|[^\s\p{L}]+)"}}}, {"behavior", "Isolated"}, {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"ignore_merges", false},
            {"vocab", vocab},
            {"merges", {"a b", "b c", nlohmann::json::array({"ab", "c"}), chars[' '] + " a"}}}}};
}

TEST(HfBpeTokenizer, MergesAddedTokensAndDecode) {
  testing::TempDir dir;
  write(dir / "tokenizer.json", tiny_hf().dump());
  const auto tok = HfBpeTokenizer::load(dir / "tokenizer.json");
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok.encode("bcab"), (std::vector<int32_t>{257, 256}));
  // Added special tokens are cut out of the text first, then each segment is pre-tokenized.
  EXPECT_EQ(tok.encode("[INST]abc<s>"), (std::vector<int32_t>{301, 258, 300}));
  EXPECT_EQ(tok.special_id("[INST]"), 301);
  EXPECT_EQ(tok.decode(tok.encode("[INST]x abc é")), "x abc é");
  EXPECT_EQ(tok.decode(tok.encode("[INST]x"), /*keep_special=*/true), "[INST]x");
  HfBpeOptions split;
  split.split_special_tokens = true;
  const auto plain = HfBpeTokenizer::load(dir / "tokenizer.json", split);
  EXPECT_EQ(plain.encode("[INST]"), (std::vector<int32_t>{'[', 'I', 'N', 'S', 'T', ']'}));
  EXPECT_CONTAINS(error_of([&] { tok.special_id("[IMG]"); }), "expected a special added token '[IMG]'");
}

TEST(HfBpeTokenizer, FixMistralRegexReplacesTheFirstSplit) {
  testing::TempDir dir;
  write(dir / "tokenizer.json", tiny_hf().dump());
  const auto plain = HfBpeTokenizer::load(dir / "tokenizer.json");
  EXPECT_EQ(plain.split_patterns(), (std::vector<std::string>{R"(\p{L}+|\s+|[^\s\p{L}]+)"}));
  // The file's Split keeps " " apart from "a"; the tekken regex glues " a" (one token 259).
  EXPECT_EQ(plain.encode(" a"), (std::vector<int32_t>{' ', 'a'}));
  HfBpeOptions fix;
  fix.fix_mistral_regex = true;
  const auto fixed = HfBpeTokenizer::load(dir / "tokenizer.json", fix);
  EXPECT_EQ(fixed.split_patterns(), (std::vector<std::string>{kTekkenPattern}));
  EXPECT_EQ(fixed.encode(" a"), (std::vector<int32_t>{259}));
  // A lone ByteLevel gets the Split put in front of it.
  auto file = tiny_hf();
  file["pre_tokenizer"] = file["pre_tokenizer"]["pretokenizers"][1];
  write(dir / "lone.json", file.dump());
  EXPECT_EQ(HfBpeTokenizer::load(dir / "lone.json", fix).split_patterns(), (std::vector<std::string>{kTekkenPattern}));
}

TEST(HfBpeTokenizer, LoadErrorsSayWhatAndWhere) {
  testing::TempDir dir;
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "absent.json"); }), "absent.json: no such file");
  write(dir / "bad.json", "not json");
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "bad.json"); }), "not valid JSON");
  auto file = tiny_hf();
  file["normalizer"] = {{"type", "NFC"}};
  write(dir / "norm.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "norm.json"); }), ".normalizer: expected null");
  file = tiny_hf();
  file["model"]["type"] = "Unigram";
  write(dir / "type.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "type.json"); }), "model.type: expected \"BPE\", found \"Unigram\"");
  file = tiny_hf();
  file["model"]["merges"].push_back("zz q");
  write(dir / "merge.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "merge.json"); }), "merges[4]: expected tokens of the vocab, found \"zz\"");
  file = tiny_hf();
  file["pre_tokenizer"]["pretokenizers"].erase(1);
  write(dir / "nobyte.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "nobyte.json"); }), "expected a ByteLevel pre-tokenizer");
  file = tiny_hf();
  file["added_tokens"][0]["lstrip"] = true;
  write(dir / "lstrip.json", file.dump());
  EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "lstrip.json"); }), "added_tokens[0].lstrip: expected false");
  // Ids index a table: negative ones (which wrote outside it) and huge ones (which allocated
  // tens of GB) are refused.
  for (const int64_t id : {int64_t{-1}, int64_t{2147483647}, int64_t{4294967296}}) {
    file = tiny_hf();
    file["added_tokens"][1]["id"] = id;
    write(dir / "id.json", file.dump());
    EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "id.json"); }),
                    "added_tokens[1].id: expected a token id in [0, 16777216), found " + std::to_string(id));
    file = tiny_hf();
    file["model"]["vocab"]["ab"] = id;
    write(dir / "id.json", file.dump());
    EXPECT_CONTAINS(error_of([&] { HfBpeTokenizer::load(dir / "id.json"); }), "vocab[\"ab\"]: expected a token id in [0, 16777216)");
  }
}

TEST(ByteBpe, TekkenPatternPieces) {
  const PieceSplitter splitter(kTekkenPattern, "test");
  const std::string text = "Hello WORLDwide 2024!\n\n  x\xC2\x85!";
  std::vector<std::string> pieces;
  for (const auto& [b, e] : splitter.matches(text)) pieces.push_back(text.substr(b, e - b));
  // Case-split words, single digits, punctuation run, newline run, whitespace before a word;
  // U+0085 is White_Space (Rust regex, Oniguruma), so it is not glued to "!" as punctuation.
  EXPECT_EQ(pieces, (std::vector<std::string>{"Hello", " WORLDwide", " ", "2", "0", "2", "4", "!\n\n", " ", " x",
                                              "\xC2\x85", "!"}));
}

TEST(ByteBpe, WhiteSpaceRewriteAndHelpers) {
  EXPECT_EQ(rewrite_white_space(R"(\s+(?!\S)|[^\s\p{L}]|\\s)"),
            R"(\p{White_Space}+(?!\P{White_Space})|[^\p{White_Space}\p{L}]|\\s)");
  // PCRE2's UCP \s matches U+180E; the rewritten pattern, like Rust regex, does not.
  const PieceSplitter space(R"(\s)", "test");
  EXPECT_TRUE(space.matches("\xE1\xA0\x8E").empty());
  EXPECT_EQ(space.matches("\xE3\x80\x80").size(), 1u);  // U+3000 ideographic space
  // RFC 4648 section 10 vectors, both ways.
  const std::pair<const char*, const char*> rfc4648[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : rfc4648) {
    EXPECT_EQ(base64_encode(plain), encoded);
    EXPECT_EQ(base64_decode(encoded, "t"), plain);
  }
  EXPECT_EQ(base64_decode("aGVsbG8=", "t"), "hello");
  EXPECT_EQ(base64_decode("AA==", "t"), std::string(1, '\0'));
  EXPECT_CONTAINS(error_of([] { base64_decode("a*b=", "where"); }), "where: expected base64");
  // Python: b"\xe2\x82A\xff\xf0\x80".decode("utf-8", "replace") == "\ufffdA\ufffd\ufffd\ufffd"
  EXPECT_EQ(utf8_decode_lossy("\xE2\x82" "A\xFF\xF0\x80"), "\xEF\xBF\xBD" "A\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(byte_level_chars()[' '], "\xC4\xA0");  // "Ġ"
  EXPECT_EQ(byte_level_chars()['a'], "a");
}

}  // namespace
}  // namespace mmtrain::tokenizer
