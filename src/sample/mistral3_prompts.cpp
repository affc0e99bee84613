#include "sample/mistral3_prompts.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/text.h"
#include "io/safetensors.h"
#include "io/user_file.h"
#include "models/incremental_decoder.h"
#include "train/run.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <sstream>

namespace mmtrain::sample {

namespace fs = std::filesystem;

Mistral3Prompts read_mistral3_prompts(const Config& config, const std::string& path, const std::string& image_dir) {
  DataConfig data = config.data;
  // A preference set (a DPO run's) and GRPO's prompts encode their conversations as the conversation data does.
  if (data.dataset_type != "huggingface" && data.dataset_type != "preference" && data.dataset_type != "prompts")
    fail("mistral3 prompts ", path, ": config ", config.source_path,
         ": data.dataset_param.dataset_type must be the conversation data ",
         "set (huggingface, preference or prompts), found '", data.dataset_type,
         "': the prompts are read with its template and images");
  auto& basic = data.dataset_param["basic_parameters"];
  basic["dataset"] = path;
  if (!image_dir.empty()) basic["dataset_dir"] = image_dir;
  else if (!basic.contains("dataset_dir")) basic["dataset_dir"] = fs::path(path).parent_path().string();
  basic["max_samples"] = 0;
  basic["packing"] = false;
  auto options = conversation::ConversationDataOptions::from_config(data, config.model);
  options.generation = true;
  Mistral3Prompts out;
  out.records = std::make_unique<conversation::ConversationDataset>(options);
  const auto& prompts = *out.records;
  if (!prompts.dropped().empty()) {
    std::string reasons;
    for (const auto& [reason, count] : prompts.dropped())
      reasons += (reasons.empty() ? "" : "; ") + reason + " (" + std::to_string(count) + ")";
    fail(path, ": ", prompts.records() - prompts.size(), " of ", prompts.records(), " prompts are unusable: ", reasons,
         " (", prompts.summary(), ")");
  }
  if (prompts.size() == 0) fail(path, ": no prompts");
  // Every image decoded once now (the reader checks only headers), so a prompt that cannot be
  // built fails before any output exists rather than halfway through the generations.
  for (int64_t i = 0; i < prompts.size(); ++i) prompts.get(i);
  out.tokenizer = tokenizer::load_text_tokenizer(options.tokenizer_path, options.tokenizer);
  out.eos = out.tokenizer->special_id("</s>");
  return out;

}

std::vector<int64_t> image_token_ids(const Config& config, const tokenizer::TextTokenizer& tokenizer) {
  std::vector<int64_t> ids;
  for (const char* name : {"[IMG]", "[IMG_BREAK]", "[IMG_END]"})
    if (const auto id = mmtrain::tokenizer::special_id_if_any(tokenizer, name)) ids.push_back(*id);
  const auto& c = config.model.config;
  if (c.contains("image_token_index") && c.at("image_token_index").is_number_integer()) {
    const auto id = c.at("image_token_index").get<int64_t>();
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

void refuse_context_parallel_generation(const Config& config, const std::string& who) {
  const auto& p = config.parallel;
  if (p.ring_attention_size > 1 || p.ulysses_parallel_size > 1)
    fail(who, ": parallel.ring_attention_size = ", p.ring_attention_size, " and ulysses_parallel_size = ",
         p.ulysses_parallel_size, ": Magistral's generation runs without context parallelism (its KV cache is not "
         "split over ranks); set both to 1");
}

void generate_completions(Run& run, const Mistral3Prompts& prompts, const TokenSampling& sampling, uint64_t seed,
                          bool save_logits, const std::string& out_dir) {
  auto* decoder = dynamic_cast<IncrementalDecoder*>(run.model.get());
  if (!decoder) fail("model ", run.config.model.model_id, " does not generate (no IncrementalDecoder)");

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
  const int64_t dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank(), count = prompts.records->size();
  std::string lines;
  for (int64_t round = 0; round < (count + dp - 1) / dp; ++round) {
    const int64_t index = round * dp + dp_rank;
    const bool padding = index >= count;
    Batch prompt = prompts.records->get(padding ? 0 : index);
    prompt.erase("labels");
    prompt["input_ids"] = prompt["input_ids"].unsqueeze(0);
    for (auto& [key, tensor] : prompt) tensor = tensor.to(run.comm().device());
    at::Generator generator =
        at::make_generator<at::CPUGeneratorImpl>(seed + static_cast<uint64_t>(padding ? 0 : index));
    const auto began = std::chrono::steady_clock::now();
    const auto generation = generate(*decoder, fsdp_call, prompt, prompts.eos, sampling, generator, save_logits,
                                             any_active);
    if (padding) continue;
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    // Ids past the tokenizer's vocabulary (a model vocabulary padded beyond it) have no text;
    // token_ids keeps them.
    std::vector<int32_t> answer;
    for (const int64_t id : generation.tokens)
      if (id < prompts.tokenizer->vocab_size()) answer.push_back(static_cast<int32_t>(id));
    const auto prompt_ids = prompt["input_ids"][0].to(at::kCPU);
    nlohmann::json line = {{"index", index},
                           {"prompt", prompts.records->last_user_message(index)},
                           {"completion", prompts.tokenizer->decode(answer)},
                           {"token_ids", generation.tokens},
                           {"prompt_ids", std::vector<int64_t>(prompt_ids.data_ptr<int64_t>(),
                                                               prompt_ids.data_ptr<int64_t>() + prompt_ids.numel())},
                           {"stopped_at_eos", !generation.tokens.empty() && generation.tokens.back() == prompts.eos},
                           {"seconds", took}};
    lines += line.dump() + "\n";
    if (save_logits)
      safetensors_write((fs::path(out_dir) / format("logits_%04lld.safetensors", static_cast<long long>(index))).string(),
                        {{"logits", at::stack(generation.logits)}});
    std::printf("[mmtrain] prompt %lld: %zu tokens (%.1f s)\n", static_cast<long long>(index), generation.tokens.size(),
                took);
    std::fflush(stdout);
  }
  const auto parts = run.texts_to_rank0(out_dir, "completions", lines);
  if (!run.is_rank0()) return;
  // completions.jsonl in prompt order, from every rank's part.
  std::vector<std::pair<int64_t, std::string>> all;
  for (const auto& part : parts) {
    std::istringstream in(part);
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) all.emplace_back(json_parse_checked(line, "a rank's completions")["index"].get<int64_t>(), line);
  }
  std::sort(all.begin(), all.end());
  std::string merged;
  for (const auto& [index, line] : all) merged += line + "\n";
  const std::string out = (fs::path(out_dir) / "completions.jsonl").string();
  write_file_no_follow(out, merged, out);
  run.log("wrote " + out + " (" + std::to_string(all.size()) + " completions)");
}

}  // namespace mmtrain::sample
