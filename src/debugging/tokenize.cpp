#include "debugging/tokenize.h"

#include "core/error.h"
#include "core/regular_file.h"
#include "data/tokenizer/hf_bpe.h"
#include "data/tokenizer/tekken.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>

namespace mmtrain {

void debug_tokenize(const DebugTokenizeOptions& options) {
  std::string format = options.format;
  if (format == "auto") {
    const auto file = tokenizer::read_json_file(options.tokenizer_path);
    format = file.contains("config") && file.contains("vocab") ? "tekken" : "hf";
  }
  if ((options.fix_mistral_regex || options.split_special_tokens) && format != "hf") {
    fail("debug tokenize: expected --format hf with --fix-mistral-regex / --split-special-tokens, found format ", format);
  }
  std::function<std::vector<int32_t>(const std::string&)> encode;
  std::function<std::string(const std::vector<int32_t>&)> decode;
  if (format == "tekken") {
    auto tok = std::make_shared<tokenizer::TekkenTokenizer>(tokenizer::TekkenTokenizer::load(options.tokenizer_path));
    encode = [tok](const std::string& text) { return tok->encode(text); };
    decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  } else if (format == "hf") {
    tokenizer::HfBpeOptions hf;
    hf.fix_mistral_regex = options.fix_mistral_regex;
    hf.split_special_tokens = options.split_special_tokens;
    auto tok = std::make_shared<tokenizer::HfBpeTokenizer>(tokenizer::HfBpeTokenizer::load(options.tokenizer_path, hf));
    encode = [tok](const std::string& text) { return tok->encode(text); };
    decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids); };
  } else {
    fail("debug tokenize: expected --format tekken, hf or auto, found ", format);
  }

  require_regular_file(options.in_path, "debug tokenize --in " + options.in_path, "a text file, one string per line");
  std::ifstream in(options.in_path);
  if (!in) fail("debug tokenize: expected a readable --in file, found none at ", options.in_path);
  std::ofstream out(options.out_path);
  if (!out) fail("debug tokenize: expected a writable --out file, found ", options.out_path, " not writable");
  std::string line;
  for (size_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    nlohmann::json text;
    try {
      text = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail(options.in_path, ":", number, ": expected a JSON string, found a parse error: ", e.what());
    }
    if (!text.is_string()) fail(options.in_path, ":", number, ": expected a JSON string, found ", text.type_name());
    const auto ids = encode(text.get<std::string>());
    out << nlohmann::json{{"ids", ids}, {"text", decode(ids)}}.dump() << '\n';
  }
  if (!out.flush()) fail("debug tokenize: expected to write ", options.out_path, ", found a write error");
}

}  // namespace mmtrain
