// `mmtrain sample mistral3 CONFIG --load DIR --prompts FILE.jsonl --out DIR`: Magistral's answers to
// prompts in the training data's own format, generated with a key/value cache
// (sample/token_generation.h), greedy or with temperature and top-p, FSDP-sharded over the ranks
// with the prompts split over the data-parallel ranks. docs/sampling.md.
#include "config/config.h"
#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "data/conversation/conversation_dataset.h"
#include "dist/runtime.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "models/incremental_decoder.h"
#include "sample/token_generation.h"
#include "core/cli_command.h"
#include "tools/tool_model.h"
#include "train/run.h"

#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>

namespace mmtrain {

namespace {

namespace fs = std::filesystem;

struct Options {
  std::string config_path, load, prompts, out, image_dir;
  int64_t max_new_tokens = 256;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 0;
  bool no_kv_cache = false, save_logits = false;
  std::vector<std::string> overrides;
};

// The last user message of each JSONL record (what the completion answers), for the output.
std::vector<std::string> last_user_messages(const std::string& path) {
  std::istringstream lines(read_user_file(path, "--prompts", int64_t{1} << 30));
  std::vector<std::string> out;
  std::string line;
  for (int64_t number = 1; std::getline(lines, line); ++number) {
    if (trim(line).empty()) continue;
    const std::string where = path + ":" + std::to_string(number);
    const nlohmann::json record = json_parse_checked(line, where);
    std::string last;
    for (const char* list : {"conversations", "messages"}) {
      if (!record.is_object() || !record.contains(list) || !record[list].is_array()) continue;
      for (const auto& m : record[list]) {
        const bool sharegpt = m.contains("from");
        const auto role = m.value(sharegpt ? "from" : "role", std::string());
        if ((role == "human" || role == "user") && m.contains(sharegpt ? "value" : "content"))
          last = m[sharegpt ? "value" : "content"].get<std::string>();
      }
    }
    out.push_back(last);
  }
  return out;
}

void run_sample(const Options& o) {
  Config config = config_load(o.config_path, o.overrides);
  if (config.model.model_id != "mistral3")
    fail("sample mistral3: config ", o.config_path, " is a '", config.model.model_id, "' model");
  config.training.save.clear();
  config.training.load.clear();
  config.training.async_save = false;
  config.training.keep_best = 0;
  sample::TokenSampling sampling;
  sampling.max_new_tokens = o.max_new_tokens;
  sampling.temperature = o.temperature;
  sampling.top_p = o.top_p;
  sampling.kv_cache = !o.no_kv_cache;
  if (o.max_new_tokens < 1 || o.max_new_tokens > 65536) fail("--max-new-tokens must be in 1..65536, found ", o.max_new_tokens);
  if (!(o.temperature >= 0 && std::isfinite(o.temperature))) fail("--temperature must be >= 0, found ", o.temperature);
  if (!(o.top_p > 0 && o.top_p <= 1)) fail("--top-p must be in (0, 1], found ", o.top_p);

  // The prompts through the training data's own reader: its chat template, images and checks.
  DataConfig data = config.data;
  if (data.dataset_type != "huggingface")
    fail("sample mistral3: config ", o.config_path, ": data.dataset_param.dataset_type must be the conversation data ",
         "set (huggingface), found '", data.dataset_type, "': the prompts are read with its template and images");
  auto& basic = data.dataset_param["basic_parameters"];
  basic["dataset"] = o.prompts;
  if (!o.image_dir.empty()) basic["dataset_dir"] = o.image_dir;
  else if (!basic.contains("dataset_dir")) basic["dataset_dir"] = fs::path(o.prompts).parent_path().string();
  basic["max_samples"] = 0;
  basic["packing"] = false;
  auto options = conversation::ConversationDataOptions::from_config(data, config.model);
  options.generation = true;
  const conversation::ConversationDataset prompts(options);
  if (!prompts.dropped().empty()) {
    std::string reasons;
    for (const auto& [reason, count] : prompts.dropped()) reasons += (reasons.empty() ? "" : "; ") + reason + " (" + std::to_string(count) + ")";
    fail(o.prompts, ": ", prompts.records() - prompts.size(), " of ", prompts.records(), " prompts are unusable: ", reasons,
         " (", prompts.summary(), ")");
  }
  if (prompts.size() == 0) fail(o.prompts, ": no prompts");
  const std::vector<std::string> questions = last_user_messages(o.prompts);
  const auto tokenizer = tokenizer::load_text_tokenizer(options.tokenizer_path, options.tokenizer);
  const int64_t eos = tokenizer->special_id("</s>");

  auto runtime = runtime_init(LaunchEnv::from_environment(), default_device(),
                              std::chrono::seconds(config.parallel.timeout_s));
  Run run;
  run.config = std::move(config);
  run.runtime = std::move(runtime);
  make_new_output_dir(run, o.out, "--out");
  build_tool_model(run, "sample mistral3");
  load_tool_weights(run, o.load, "sample --load", ".sample_from_dcp_");
  auto* decoder = dynamic_cast<IncrementalDecoder*>(run.model.get());
  if (!decoder) fail("sample mistral3: the model does not generate (no IncrementalDecoder)");

  at::NoGradGuard no_grad;
  auto fsdp_call = [&](const std::function<at::Tensor()>& call) {
    run.fsdp->begin_forward();
    at::Tensor logits = call();
    run.fsdp->finish_forward_only();
    return logits.to(at::kCPU);
  };
  auto any_active = [&](bool active) { return run.comm().any_rank(active); };
  // Prompt i goes to data-parallel rank i % dp; a rank with fewer prompts generates for prompt 0
  // again and drops it, as FSDP's gathers need every rank in every forward.
  const int64_t dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank(), count = prompts.size();
  const std::string part = (fs::path(o.out) / (".completions.rank" + std::to_string(run.comm().rank()))).string();
  std::string lines;
  for (int64_t round = 0; round < (count + dp - 1) / dp; ++round) {
    const int64_t index = round * dp + dp_rank;
    const bool padding = index >= count;
    Batch prompt = prompts.get(padding ? 0 : index);
    prompt.erase("labels");
    prompt["input_ids"] = prompt["input_ids"].unsqueeze(0);
    for (auto& [key, tensor] : prompt) tensor = tensor.to(run.comm().device());
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(o.seed + static_cast<uint64_t>(padding ? 0 : index));
    const auto began = std::chrono::steady_clock::now();
    const auto generation = sample::generate(*decoder, fsdp_call, prompt, eos, sampling, generator, o.save_logits,
                                             any_active);
    if (padding) continue;
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    // Ids past the tokenizer's vocabulary (a model vocabulary padded beyond it) have no text;
    // token_ids keeps them.
    std::vector<int32_t> answer;
    for (const int64_t id : generation.tokens)
      if (id < tokenizer->vocab_size()) answer.push_back(static_cast<int32_t>(id));
    const auto prompt_ids = prompt["input_ids"][0].to(at::kCPU);
    nlohmann::json line = {{"index", index},
                           {"prompt", index < static_cast<int64_t>(questions.size()) ? questions[index] : ""},
                           {"completion", tokenizer->decode(answer)},
                           {"token_ids", generation.tokens},
                           {"prompt_ids", std::vector<int64_t>(prompt_ids.data_ptr<int64_t>(),
                                                               prompt_ids.data_ptr<int64_t>() + prompt_ids.numel())},
                           {"stopped_at_eos", !generation.tokens.empty() && generation.tokens.back() == eos},
                           {"seconds", took}};
    lines += line.dump() + "\n";
    if (o.save_logits)
      safetensors_write((fs::path(o.out) / format("logits_%04lld.safetensors", static_cast<long long>(index))).string(),
                        {{"logits", at::stack(generation.logits)}});
    std::printf("[mmtrain] prompt %lld: %zu tokens (%.1f s)\n", static_cast<long long>(index), generation.tokens.size(),
                took);
    std::fflush(stdout);
  }
  write_file_no_follow(part, lines, part);
  run.comm().barrier();
  if (!run.is_rank0()) return;
  // completions.jsonl in prompt order, from every rank's part.
  std::vector<std::pair<int64_t, std::string>> all;
  for (int r = 0; r < run.comm().world_size(); ++r) {
    const std::string path = (fs::path(o.out) / (".completions.rank" + std::to_string(r))).string();
    std::istringstream in(read_user_file(path, "a rank's completions", int64_t{1} << 30));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) all.emplace_back(json_parse_checked(line, path)["index"].get<int64_t>(), line);
    fs::remove(path);
  }
  std::sort(all.begin(), all.end());
  std::string merged;
  for (const auto& [index, line] : all) merged += line + "\n";
  const std::string out = (fs::path(o.out) / "completions.jsonl").string();
  write_file_no_follow(out, merged, out);
  run.log("wrote " + out + " (" + std::to_string(all.size()) + " completions)");
}


const CliRegistration sample_command(
    sample_registry(), "mistral3",
    {"Magistral's answers to conversations (greedy or top-p, KV cache)", [](CLI::App& command) {
  auto* cmd = &command;
  auto o = std::make_shared<Options>();
  cmd->add_option("config", o->config_path, "YAML config of the model (model, data template and images, parallelism)")
      ->required();
  cmd->add_option("--load", o->load, "mmtrain checkpoint, HF model directory or DCP")->required();
  cmd->add_option("--prompts", o->prompts, "JSONL of records in the training data's format; a final assistant "
                  "message is dropped")->required();
  cmd->add_option("--out", o->out, "output directory (new): completions.jsonl")->required();
  cmd->add_option("--image-dir", o->image_dir, "root of relative image paths (default the config's dataset_dir)");
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "stop after this many tokens (or at </s>)")
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "with --temperature > 0: nucleus sampling")->capture_default_str();
  cmd->add_option("--seed", o->seed, "prompt i samples with seed + i")->capture_default_str();
  cmd->add_flag("--no-kv-cache", o->no_kv_cache, "recompute the whole prefix for every token (the reference path)");
  cmd->add_flag("--save-logits", o->save_logits, "also write logits_<i>.safetensors: each generated token's logits");
  cmd->add_option("--set", o->overrides, "override a config key (repeatable)");
  return [o] { run_sample(*o); };
}});


}  // namespace

}  // namespace mmtrain
