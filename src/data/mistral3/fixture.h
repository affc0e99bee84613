// `mmtrain fixture mistral3`: a self-contained image-text SFT set for tiny mistral3 configs, in
// the "huggingface" dataset layout: out_dir/tekken.json (byte-level: the 20 mistral-common
// control tokens then the 256 bytes, vocab 276), out_dir/images/*.png (a colour under a texture, sides in
// [min_side, max_side]), out_dir/conversations.json (LLaVA style; a quarter of the records hold
// two images). Each answer names the colour (and for two-image records, which is wider), so a
// model that reads its images can lower the loss well below one that cannot. bad_records appends
// one record per reason the dataset drops (missing image, corrupt image, no assistant turn,
// <image> count mismatch, malformed, and an image after a prompt of long_prompt_bytes that
// truncation cuts). mix (a ragged set, for token-budget micro-batches): 0 to 4 images per record
// and a prompt with 0 to mix_filler_words filler words, so that records differ widely in tokens.
#pragma once
#include <cstdint>
#include <string>

namespace mmtrain::mistral3 {

struct Mistral3DataFixture {
  int64_t samples = 64;
  int64_t min_side = 8;
  int64_t max_side = 40;
  bool bad_records = false;
  bool mix = false;
  int64_t mix_filler_words = 60;
  int64_t long_prompt_bytes = 600;
  uint64_t seed = 0;
};

void fixture_mistral3_data(const std::string& out_dir, const Mistral3DataFixture& options);

// The set's pieces, shared with the preference set (data/mistral3/preference_fixture.cpp):
void write_fixture_tokenizer(const std::string& path);  // the tekken.json above
int64_t fixture_colours();                              // how many colours the images take
const char* fixture_colour_name(int64_t colour);        // "red", ...
// A PNG of colour `colour` under a texture.
void write_fixture_png(const std::string& path, int64_t colour, int64_t height, int64_t width);

}  // namespace mmtrain::mistral3
