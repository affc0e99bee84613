// `mmtrain debug tokenize` (hidden): runs a tokenizer file over a JSONL of strings, for the
// parity tests against mistral-common and HF tokenizers (tests/parity/test_tokenizer_parity.py).
// Input: one JSON string per line. Output: one JSON object per line,
// {"ids": [...], "text": decode(ids)}, in input order.
#pragma once
#include <string>

namespace mmtrain {

struct DebugTokenizeOptions {
  std::string tokenizer_path;
  std::string format = "auto";  // tekken | hf | auto (tekken when the file has "config" and "vocab")
  bool fix_mistral_regex = false;     // hf only
  bool split_special_tokens = false;  // hf only
  std::string in_path;
  std::string out_path;
};

void debug_tokenize(const DebugTokenizeOptions& options);

}  // namespace mmtrain
