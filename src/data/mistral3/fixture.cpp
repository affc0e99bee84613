#include "data/mistral3/fixture.h"

#include "core/cli_command.h"
#include "core/error.h"
#include "data/tokenizer/byte_bpe.h"
#include "data/tokenizer/tekken.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <CLI/CLI.hpp>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

namespace mmtrain::mistral3 {
namespace {
namespace fs = std::filesystem;

struct Colour {
  const char* name;
  uint8_t rgb[3];
};
const Colour kColours[] = {{"red", {220, 30, 30}},   {"green", {30, 200, 60}}, {"blue", {40, 60, 220}},
                           {"yellow", {230, 220, 40}}, {"black", {10, 10, 10}}, {"white", {250, 250, 250}}};

// A --mix record: 0 to 4 solid-colour images of random sides and a prompt with up to
// `filler_words` filler words; the answer lists the colours in order.
template <typename Draw>
nlohmann::json mixed_record(const fs::path& root, int64_t i, Draw& draw, int64_t filler_words) {
  const int64_t images = draw(0, 4), words = draw(0, filler_words);
  std::string prompt, answer;
  std::vector<std::string> files;
  for (int64_t k = 0; k < images; ++k) {
    const int64_t c = draw(0, static_cast<int64_t>(std::size(kColours)) - 1);
    const int64_t side = draw(0, 1) ? 8 : 40;  // small and large images: image tokens differ 25x
    const std::string name = "img_" + std::to_string(i) + "_" + std::to_string(k) + ".png";
    write_fixture_png((root / "images" / name).string(), c, side, draw(8, 40));
    files.push_back("images/" + name);
    prompt += "<image>";
    answer += std::string(k ? ", " : "") + kColours[c].name;
  }
  prompt += images ? "\nName the colours" : "Say that there is no picture";
  for (int64_t w = 0; w < words; ++w) prompt += w % 2 ? " please" : " now";
  answer = images ? "They are " + answer + "." : "There is no picture.";
  nlohmann::json record = {{"id", "sample_" + std::to_string(i)},
                           {"conversations", {{{"from", "human"}, {"value", prompt + "."}}, {{"from", "gpt"}, {"value", answer}}}}};
  if (images == 1) record["image"] = files[0];
  if (images > 1) record["images"] = files;
  return record;
}

}  // namespace

int64_t fixture_colours() { return static_cast<int64_t>(std::size(kColours)); }
const char* fixture_colour_name(int64_t colour) { return kColours[colour].name; }

void write_fixture_tokenizer(const std::string& path) {
  const auto& control_tokens = tokenizer::tekken_default_special_tokens();
  const int64_t num_special = static_cast<int64_t>(control_tokens.size());
  nlohmann::json specials = nlohmann::json::array();
  for (int64_t i = 0; i < num_special; ++i)
    specials.push_back({{"rank", i}, {"token_str", control_tokens[i]}, {"is_control", true}});
  nlohmann::json vocab = nlohmann::json::array();
  for (int b = 0; b < 256; ++b)
    vocab.push_back({{"rank", b}, {"token_bytes", tokenizer::base64_encode(std::string(1, char(b)))}, {"token_str", nullptr}});
  nlohmann::json file = {
      {"config",
       {{"pattern", tokenizer::kTekkenPattern}, {"num_vocab_tokens", 256}, {"default_vocab_size", num_special + 256},
        {"default_num_special_tokens", num_special}, {"version", "v7"}}},
      {"vocab", vocab},
      {"special_tokens", specials}};
  std::ofstream(path) << file.dump();
}

// The colour with a texture over it (a diagonal ramp and a 4-pixel checker, +-28 per channel):
// patches of a solid image are all alike, so the vision tower's attention would see one token
// repeated and its q/k would get no gradient; the colour still dominates every pixel.
void write_fixture_png(const std::string& path, int64_t colour, int64_t height, int64_t width) {
  const uint8_t* rgb = kColours[colour].rgb;
  std::vector<uint8_t> pixels(static_cast<size_t>(height * width * 3));
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) {
      const int texture = static_cast<int>((x * 7 + y * 13) % 32) - 16 + (((x / 4 + y / 4) % 2) ? 12 : -12);
      for (int c = 0; c < 3; ++c)
        pixels[static_cast<size_t>((y * width + x) * 3 + c)] = static_cast<uint8_t>(std::clamp(rgb[c] + texture, 0, 255));
    }
  if (!stbi_write_png(path.c_str(), int(width), int(height), 3, pixels.data(), int(width * 3)))
    fail("fixture mistral3: cannot write ", path);
}

void fixture_mistral3_data(const std::string& out_dir, const Mistral3DataFixture& o) {
  if (o.samples < 1) fail("fixture mistral3: --samples must be >= 1, found ", o.samples);
  if (o.min_side < 1 || o.max_side < o.min_side)
    fail("fixture mistral3: need 1 <= --min-side <= --max-side, found ", o.min_side, " and ", o.max_side);
  const fs::path root(out_dir);
  fs::create_directories(root / "images");
  write_fixture_tokenizer((root / "tekken.json").string());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  auto draw = [&](int64_t low, int64_t high) { return at::randint(low, high + 1, {1}, gen, at::kLong).item<int64_t>(); };
  const int64_t colours = std::size(kColours);
  nlohmann::json records = nlohmann::json::array();
  for (int64_t i = 0; i < o.samples; ++i) {
    if (o.mix) {
      records.push_back(mixed_record(root, i, draw, o.mix_filler_words));
      continue;
    }
    const bool two_images = draw(0, 3) == 0;
    std::vector<std::string> files;
    std::vector<int64_t> widths, picked;
    for (int k = 0; k < (two_images ? 2 : 1); ++k) {
      const int64_t c = draw(0, colours - 1), h = draw(o.min_side, o.max_side), w = draw(o.min_side, o.max_side);
      const std::string name = "img_" + std::to_string(i) + "_" + std::to_string(k) + ".png";
      write_fixture_png((root / "images" / name).string(), c, h, w);
      files.push_back("images/" + name);
      widths.push_back(w);
      picked.push_back(c);
    }
    nlohmann::json turns;
    if (two_images) {
      const char* wider = widths[0] >= widths[1] ? "first" : "second";
      turns = {{{"from", "human"}, {"value", "Compare <image> and <image>."}},
               {{"from", "gpt"},
                {"value", std::string("The first is ") + kColours[picked[0]].name + ", the second is " +
                              kColours[picked[1]].name + "; the " + wider + " is wider."}}};
    } else {
      turns = {{{"from", "human"}, {"value", "<image>\nWhat colour is this picture?"}},
               {{"from", "gpt"}, {"value", std::string("It is ") + kColours[picked[0]].name + "."}}};
    }
    nlohmann::json record = {{"id", "sample_" + std::to_string(i)}, {"conversations", turns}};
    if (two_images)
      record["images"] = files;
    else
      record["image"] = files[0];
    records.push_back(record);
  }
  if (o.bad_records) {
    std::ofstream(root / "images" / "corrupt.png") << "this is not a png";
    const nlohmann::json ask = {{"from", "human"}, {"value", "<image>\nWhat colour is this picture?"}};
    const nlohmann::json answer = {{"from", "gpt"}, {"value", "It is red."}};
    records.push_back({{"id", "bad_missing_image"}, {"image", "images/does_not_exist.png"}, {"conversations", {ask, answer}}});
    records.push_back({{"id", "bad_corrupt_image"}, {"image", "images/corrupt.png"}, {"conversations", {ask, answer}}});
    records.push_back({{"id", "bad_no_assistant"}, {"image", "images/img_0_0.png"}, {"conversations", {ask}}});
    records.push_back({{"id", "bad_image_count"}, {"images", {"images/img_0_0.png", "images/img_0_0.png"}},
                       {"conversations", {ask, answer}}});
    records.push_back({{"id", "bad_malformed"}, {"conversations", "not a list"}});
    // A long prompt before a trailing image: truncation to a short cutoff_len cuts the image block.
    const std::string long_prompt(o.long_prompt_bytes, 'x');
    records.push_back({{"id", "bad_truncated_image"}, {"image", "images/img_0_0.png"},
                       {"conversations", {{{"from", "human"}, {"value", long_prompt + "\n<image>"}}, answer}}});
  }
  std::ofstream(root / "conversations.json") << records.dump(1);
  std::printf("wrote %lld records (%s) with tekken.json and images/ to %s\n",
              static_cast<long long>(records.size()), o.bad_records ? "bad records included" : "all good",
              out_dir.c_str());
}

namespace {

struct FixtureArgs {
  std::string out_dir;
  Mistral3DataFixture options;
};

const CliRegistration fixture(fixture_registry(), 
    "mistral3", {"image-text SFT set for mistral3: tekken.json, images/, conversations.json (dataset huggingface)",
                 [](CLI::App& cmd) {
                   auto a = std::make_shared<FixtureArgs>();
                   auto& o = a->options;
                   cmd.add_option("--out", a->out_dir, "output directory")->required();
                   cmd.add_option("--samples", o.samples, "number of good records")->capture_default_str();
                   cmd.add_option("--seed", o.seed, "random seed")->capture_default_str();
                   cmd.add_option("--min-side", o.min_side, "smallest image side in pixels")->capture_default_str();
                   cmd.add_option("--max-side", o.max_side, "largest image side in pixels")->capture_default_str();
                   cmd.add_flag("--bad-records", o.bad_records, "append one record per reason the dataset drops");
                   cmd.add_flag("--mix", o.mix,
                                "ragged records: 0-4 images of 8 or 40 px high and prompts of 0 to --filler-words "
                                "filler words");
                   cmd.add_option("--filler-words", o.mix_filler_words, "most filler words of a --mix prompt")
                       ->capture_default_str();
                   return [a] { fixture_mistral3_data(a->out_dir, a->options); };
                 }});

}  // namespace
}  // namespace mmtrain::mistral3

