#include "data/tokenizer/text_tokenizer.h"

#include "core/error.h"
#include "data/tokenizer/hf_bpe.h"
#include "data/tokenizer/tekken.h"

#include <filesystem>

namespace mmtrain::tokenizer {
namespace {

// Either file format behind the interface; Tokenizer is TekkenTokenizer or HfBpeTokenizer.
template <typename Tokenizer>
class FileTokenizer final : public TextTokenizer {
 public:
  FileTokenizer(const std::string& path, Tokenizer tokenizer) : path_(path), tok_(std::move(tokenizer)) {}
  std::vector<int32_t> encode(const std::string& text) const override { return tok_.encode(text); }
  std::string decode(const std::vector<int32_t>& ids) const override { return tok_.decode(ids); }
  int32_t special_id(const std::string& name) const override { return tok_.special_id(name); }
  int32_t vocab_size() const override { return tok_.vocab_size(); }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  Tokenizer tok_;
};

}  // namespace

std::optional<int32_t> special_id_if_any(const TextTokenizer& tokenizer, const std::string& name) {
  try {
    return tokenizer.special_id(name);
  } catch (const Error&) {
    return std::nullopt;
  }
}

std::shared_ptr<TextTokenizer> load_text_tokenizer(const std::string& path, const TextTokenizerOptions& options) {
  namespace fs = std::filesystem;
  fs::path file = path;
  if (fs::is_directory(file)) {
    if (fs::exists(file / "tekken.json"))
      file /= "tekken.json";
    else if (fs::exists(file / "tokenizer.json"))
      file /= "tokenizer.json";
    else
      fail("tokenizer: directory ", path, " holds neither tekken.json nor tokenizer.json");
  } else if (!fs::exists(file)) {
    fail("tokenizer: ", path, " does not exist (expected tekken.json, tokenizer.json or a directory holding one)");
  }
  if (file.filename() == "tokenizer.json") {
    HfBpeOptions hf;
    hf.fix_mistral_regex = options.fix_mistral_regex;
    hf.split_special_tokens = options.split_special_tokens;
    return std::make_shared<FileTokenizer<HfBpeTokenizer>>(file.string(), HfBpeTokenizer::load(file.string(), hf));
  }
  return std::make_shared<FileTokenizer<TekkenTokenizer>>(file.string(), TekkenTokenizer::load(file.string()));
}

}  // namespace mmtrain::tokenizer
