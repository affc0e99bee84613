// `mmtrain fixture mistral3-preferences`: a self-contained preference set for tiny mistral3 configs
// (dataset_type preference, data/conversation/preference_dataset.h): out_dir/tekken.json and
// images/ as `fixture mistral3`, and out_dir/preferences.json in TRL's format. Each pair asks for an
// image's colour; the chosen answer names it, the rejected one names another. Every third record
// gives its prompt implicitly (chosen and rejected as whole conversations), every other one writes
// its prompt's content as a list of parts ({"type": "image"}, {"type": "text"}). bad_records appends
// one record per reason the set drops (identical answers, an empty answer, an answer of two
// messages, a malformed record, a missing image, a pair longer than long_answer_bytes allow).
#include "core/cli_command.h"
#include "core/error.h"
#include "data/mistral3/fixture.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

namespace mmtrain::mistral3 {
namespace {

namespace fs = std::filesystem;

struct PreferenceFixture {
  std::string out_dir;
  int64_t pairs = 16;
  uint64_t seed = 0;
  bool bad_records = false;
  int64_t long_answer_bytes = 600;
};

nlohmann::json message(const std::string& role, nlohmann::json content) {
  return {{"role", role}, {"content", std::move(content)}};
}

nlohmann::json pair_record(int64_t i, const std::string& image, const std::string& chosen, const std::string& rejected) {
  const std::string question = "What colour is this picture?";
  const nlohmann::json prompt = {i % 2 ? message("user", "<image>\n" + question)
                                       : message("user", nlohmann::json::array({{{"type", "image"}},
                                                                                {{"type", "text"}, {"text", question}}}))};
  nlohmann::json record = {{"id", "pair_" + std::to_string(i)}, {"images", {image}}};
  if (i % 3 == 2) {  // TRL's implicit prompt
    record["chosen"] = {prompt[0], message("assistant", chosen)};
    record["rejected"] = {prompt[0], message("assistant", rejected)};
  } else {
    record["prompt"] = prompt;
    record["chosen"] = {message("assistant", chosen)};
    record["rejected"] = {message("assistant", rejected)};
  }
  return record;
}

void write_preferences(const PreferenceFixture& o) {
  if (o.pairs < 1) fail("fixture mistral3-preferences: --pairs must be >= 1, found ", o.pairs);
  const fs::path root(o.out_dir);
  fs::create_directories(root / "images");
  write_fixture_tokenizer((root / "tekken.json").string());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  auto draw = [&](int64_t low, int64_t high) { return at::randint(low, high + 1, {1}, gen, at::kLong).item<int64_t>(); };
  const int64_t colours = fixture_colours();
  nlohmann::json records = nlohmann::json::array();
  for (int64_t i = 0; i < o.pairs; ++i) {
    const int64_t c = draw(0, colours - 1), other = (c + draw(1, colours - 1)) % colours;
    const std::string name = "img_" + std::to_string(i) + ".png";
    write_fixture_png((root / "images" / name).string(), c, draw(8, 40), draw(8, 40));
    records.push_back(pair_record(i, "images/" + name, std::string("It is ") + fixture_colour_name(c) + ".",
                                  std::string("It is ") + fixture_colour_name(other) + "."));
  }
  if (o.bad_records) {
    const std::string image = "images/img_0.png";
    auto bad = [&](const std::string& id, nlohmann::json record) {
      record["id"] = id;
      records.push_back(std::move(record));
    };
    bad("bad_identical_answers", pair_record(0, image, "It is red.", "It is red."));
    bad("bad_empty_answer", pair_record(0, image, "It is red.", " "));
    auto two_messages = pair_record(0, image, "It is red.", "It is blue.");
    two_messages["chosen"].push_back(message("user", "Sure?"));
    bad("bad_two_message_answer", two_messages);
    bad("bad_malformed", {{"prompt", "not a list"}, {"chosen", 3}, {"rejected", nullptr}});
    bad("bad_missing_image", pair_record(0, "images/does_not_exist.png", "It is red.", "It is blue."));
    bad("bad_too_long", pair_record(0, image, "It is red." + std::string(o.long_answer_bytes, 'x'), "It is blue."));
  }
  std::ofstream(root / "preferences.json") << records.dump(1);
  std::printf("wrote %lld preference records (%s) with tekken.json and images/ to %s\n",
              static_cast<long long>(records.size()), o.bad_records ? "bad records included" : "all good",
              o.out_dir.c_str());
}

const CliRegistration fixture(
    fixture_registry(), "mistral3-preferences",
    {"image-question preference pairs for mistral3 (TRL's format): tekken.json, images/, preferences.json "
     "(dataset preference)",
     [](CLI::App& cmd) {
       auto o = std::make_shared<PreferenceFixture>();
       cmd.add_option("--out", o->out_dir, "output directory")->required();
       cmd.add_option("--pairs", o->pairs, "number of good pairs")->capture_default_str();
       cmd.add_option("--seed", o->seed, "random seed")->capture_default_str();
       cmd.add_flag("--bad-records", o->bad_records, "append one record per reason the set drops");
       return [o] { write_preferences(*o); };
     }});

}  // namespace
}  // namespace mmtrain::mistral3
