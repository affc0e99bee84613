// `mmtrain fixture mistral3-prompts`: a self-contained GRPO prompt set for tiny mistral3 configs
// (dataset_type prompts, rl/prompt_dataset.h): out_dir/tekken.json and images/ as `fixture
// mistral3`, and out_dir/prompts.jsonl, one prompt a line with a verifiable answer. Each asks how
// many letters the colour of its picture has ("red": 3) and carries the number as "answer" and the
// colour as "colour" (a field a user reward may read). bad_records appends one record the set
// drops (no user message) and one with no "answer".
#include "core/cli_command.h"
#include "core/error.h"
#include "data/mistral3/fixture.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace mmtrain::mistral3 {
namespace {

namespace fs = std::filesystem;

struct PromptFixture {
  std::string out_dir;
  int64_t prompts = 16;
  uint64_t seed = 0;
  bool bad_records = false;
};

void write_prompts(const PromptFixture& o) {
  if (o.prompts < 1) fail("fixture mistral3-prompts: --prompts must be >= 1, found ", o.prompts);
  const fs::path root(o.out_dir);
  fs::create_directories(root / "images");
  write_fixture_tokenizer((root / "tekken.json").string());
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  auto draw = [&](int64_t low, int64_t high) { return at::randint(low, high + 1, {1}, gen, at::kLong).item<int64_t>(); };
  std::string lines;
  for (int64_t i = 0; i < o.prompts; ++i) {
    const int64_t c = draw(0, fixture_colours() - 1);
    const std::string name = "img_" + std::to_string(i) + ".png";
    write_fixture_png((root / "images" / name).string(), c, draw(8, 40), draw(8, 40));
    const nlohmann::json record = {
        {"id", "prompt_" + std::to_string(i)},
        {"messages", {{{"role", "user"},
                       {"content", "<image>\nHow many letters has the colour of this picture? Answer with a number."}}}},
        {"images", {"images/" + name}},
        {"answer", std::to_string(std::strlen(fixture_colour_name(c)))},
        {"colour", fixture_colour_name(c)}};
    lines += record.dump() + "\n";
  }
  if (o.bad_records) {
    lines += nlohmann::json({{"id", "bad_no_user_message"}, {"messages", nlohmann::json::array()}}).dump() + "\n";
    lines += nlohmann::json({{"id", "bad_no_answer"},
                             {"messages", {{{"role", "user"}, {"content", "How many letters has red?"}}}}}).dump() + "\n";
  }
  std::ofstream(root / "prompts.jsonl") << lines;
  std::printf("wrote %lld prompts (%s) with tekken.json and images/ to %s\n", static_cast<long long>(o.prompts),
              o.bad_records ? "and 2 bad records" : "all good", o.out_dir.c_str());
}

const CliRegistration fixture(
    fixture_registry(), "mistral3-prompts",
    {"image questions with verifiable answers for GRPO on mistral3: tekken.json, images/, prompts.jsonl "
     "(dataset prompts)",
     [](CLI::App& cmd) {
       auto o = std::make_shared<PromptFixture>();
       cmd.add_option("--out", o->out_dir, "output directory")->required();
       cmd.add_option("--prompts", o->prompts, "number of good prompts")->capture_default_str();
       cmd.add_option("--seed", o->seed, "random seed")->capture_default_str();
       cmd.add_flag("--bad-records", o->bad_records, "append a record the set drops and one without an answer");
       return [o] { write_prompts(*o); };
     }});

}  // namespace
}  // namespace mmtrain::mistral3
