#include "rl/rollout.h"

#include "core/error.h"
#include "core/text.h"
#include "data/conversation/vlm_collator.h"
#include "data/tokenizer/text_tokenizer.h"
#include "io/user_file.h"
#include "models/incremental_decoder.h"
#include "record/sample_record.h"
#include "rl/advantages.h"
#include "rl/grpo_objective.h"
#include "rl/prompt_dataset.h"
#include "rl/rewards.h"
#include "sample/mistral3_prompts.h"
#include "sample/token_generation.h"
#include "train/run.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <sstream>

namespace mmtrain::rl {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point began) {
  return std::chrono::duration<double, std::milli>(Clock::now() - began).count();
}

// One generated completion of this rank's rollout.
struct Completion {
  int64_t micro = 0, prompt = 0;  // its micro-batch, and its prompt's place in that micro-batch
  int64_t generation = 0;         // g of G
  std::vector<int64_t> ids;       // EOS included when it ended the completion
  bool truncated = false;         // cut at max_completion_length
  std::string text;
};

// Ids 0..vocab as text for the rewards, Magistral's [THINK] and [/THINK] control tokens written out
// (decode skips control tokens) and EOS left off.
std::string completion_text(const tokenizer::TextTokenizer& tok, const std::vector<int64_t>& ids, int64_t eos,
                            int64_t think_open, int64_t think_close) {
  std::string text;
  std::vector<int32_t> run;
  for (const int64_t id : ids) {
    if (id == eos) break;
    if (id == think_open || id == think_close) {
      text += tok.decode(run) + (id == think_open ? "[THINK]" : "[/THINK]");
      run.clear();
    } else if (id >= 0 && id < tok.vocab_size()) {
      run.push_back(static_cast<int32_t>(id));
    }
  }
  return text + tok.decode(run);
}

int64_t special_or_none(const tokenizer::TextTokenizer& tok, const std::string& name) {
  try {
    return tok.special_id(name);
  } catch (const Error&) {
    return -1;  // a tokenizer without it: the model writes the marker as text
  }
}

// Sums of a [rows, columns] table whose rows are spread over the data-parallel ranks (this rank's
// at `offset`): every rank gets the whole table. Exact: each entry is one rank's value (the other
// ranks add zeros), counted once per rank of its data-parallel group and divided back.
at::Tensor gather_rows(Run& run, const std::vector<double>& mine, int64_t offset, int64_t rows, int64_t columns) {
  std::vector<double> all(static_cast<size_t>(rows * columns), 0.0);
  std::copy(mine.begin(), mine.end(), all.begin() + offset * columns);
  all = run.comm().all_reduce_sum(all);
  const double copies = static_cast<double>(run.comm().world_size() / run.mesh->dp_size());
  for (double& v : all) v /= copies;
  return at::tensor(all, at::kDouble).view({rows, columns});
}

double unbiased_std(const at::Tensor& x) { return x.numel() > 1 ? x.std().item<double>() : 0.0; }

}  // namespace

struct GrpoRollouts::State {
  GrpoConfig config;
  const PromptDataset* prompts = nullptr;
  std::shared_ptr<tokenizer::TextTokenizer> tokenizer;
  int64_t eos = 0, think_open = -1, think_close = -1;
  // Never sampled: an image token in a completion would not match the prompt's images in training.
  std::vector<int64_t> image_tokens;
  std::vector<std::unique_ptr<Reward>> rewards;
  std::vector<double> weights;

  int64_t held_data_step = -1;  // the data step whose rollout `batches` holds
  std::vector<Batch> batches;
  nlohmann::json metrics;       // of the held rollout
  double generate_ms = 0, rewards_ms = 0, reference_ms = 0;  // the current step's rollout work
  std::unique_ptr<SampleRecord> texts;

  void make(Run& run, DataLoader& loader, int64_t data_step, int64_t step);
};

GrpoRollouts::GrpoRollouts(const Run& run) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.config = run.config.training.grpo;
  s.prompts = dynamic_cast<const PromptDataset*>(run.data.dataset.get());
  if (!s.prompts) fail("training.objective grpo: the data set is not dataset_type ", kPromptsDatasetType);
  s.tokenizer = tokenizer::load_text_tokenizer(s.prompts->tokenizer_path(), s.prompts->tokenizer_options());
  s.eos = s.tokenizer->special_id("</s>");
  s.think_open = special_or_none(*s.tokenizer, "[THINK]");
  s.think_close = special_or_none(*s.tokenizer, "[/THINK]");
  s.image_tokens = sample::image_token_ids(run.config, *s.tokenizer);
  s.rewards = make_rewards(s.config);
  s.weights = s.config.reward_weights.empty() ? std::vector<double>(s.rewards.size(), 1.0) : s.config.reward_weights;
  if (rewards_read_answers(s.config)) {
    int64_t missing = 0, first = -1;
    for (int64_t i = 0; i < s.prompts->size(); ++i)
      if (!s.prompts->fields(i).contains(s.config.answer_field)) {
        ++missing;
        if (first < 0) first = i;
      }
    if (missing > 0)
      fail("training.grpo.reward_funcs compare answers, and ", missing, " of ", s.prompts->size(),
           " prompts have no field '", s.config.answer_field, "' (training.grpo.answer_field); the first is prompt ",
           first, ": \"", s.prompts->last_user_message(first).substr(0, 80), "\"");
  }
}

GrpoRollouts::~GrpoRollouts() = default;

const std::vector<Batch>& GrpoRollouts::batches_for(Run& run, DataLoader& loader, int64_t step) {
  State& s = *state_;
  s.generate_ms = s.rewards_ms = s.reference_ms = 0;
  const int64_t data_step = data_step_of(run.config, step);
  if (data_step != s.held_data_step) s.make(run, loader, data_step, step);
  return s.batches;
}

nlohmann::json GrpoRollouts::step_metrics() const {
  nlohmann::json out = state_->metrics;
  out["time/rollout_ms"] = state_->generate_ms;
  out["time/rewards_ms"] = state_->rewards_ms;
  out["time/reference_ms"] = state_->reference_ms;
  return out;
}

std::unique_ptr<SampleRecord> GrpoRollouts::take_texts() { return std::move(state_->texts); }

void GrpoRollouts::State::make(Run& run, DataLoader& loader, int64_t data_step, int64_t step) {
  auto* decoder = dynamic_cast<IncrementalDecoder*>(run.model.get());
  if (!decoder) fail("training.objective grpo: model ", run.config.model.model_id, " does not generate");
  const int64_t G = config.num_generations;
  const int64_t micro_batches = run.data.sampler.micro_batches(data_step);

  // 1. Generation: each prompt's G completions, completion g sampled with the prompt's seed + g.
  auto began = Clock::now();
  std::vector<std::vector<CollatedPrompt>> prompts_of_micro;
  for (int64_t m = 0; m < micro_batches; ++m) prompts_of_micro.push_back(split_prompts(loader.next(data_step, m)));
  std::vector<Completion> completions;
  {
    at::NoGradGuard no_grad;
    auto fsdp_call = [&](const std::function<at::Tensor()>& call) {
      run.fsdp->begin_forward();
      at::Tensor logits = call();
      run.fsdp->finish_forward_only();
      return logits.to(at::kCPU);
    };
    auto any_active = [&](bool active) { return run.comm().any_rank(active); };
    sample::TokenSampling sampling;
    sampling.max_new_tokens = config.max_completion_length;
    sampling.temperature = config.temperature;
    sampling.top_p = config.top_p;
    sampling.suppressed = image_tokens;
    for (int64_t m = 0; m < micro_batches; ++m)
      for (size_t p = 0; p < prompts_of_micro[m].size(); ++p) {
        const CollatedPrompt& prompt = prompts_of_micro[m][p];
        Batch on_device = prompt.batch;
        for (auto& [key, tensor] : on_device) tensor = tensor.to(run.comm().device());
        for (int64_t g = 0; g < G; ++g) {
          at::Generator generator =
              at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(prompt.rollout_seed + g));
          const auto generation =
              sample::generate(*decoder, fsdp_call, on_device, eos, sampling, generator, false, any_active);
          Completion c;
          c.micro = m;
          c.prompt = static_cast<int64_t>(p);
          c.generation = g;
          c.ids = generation.tokens;
          c.truncated = c.ids.back() != eos;
          c.text = completion_text(*tokenizer, c.ids, eos, think_open, think_close);
          completions.push_back(std::move(c));
        }
      }
  }
  generate_ms = ms_since(began);

  // 2. Rewards, every function over all of this rank's completions; a failure on any rank stops all.
  began = Clock::now();
  const auto prompt_of = [&](const Completion& c) -> const CollatedPrompt& { return prompts_of_micro[c.micro][c.prompt]; };
  std::vector<RewardInput> inputs;
  for (const auto& c : completions) {
    RewardInput in;
    in.prompt = prompts->last_user_message(prompt_of(c).sample_index);
    in.completion = c.text;
    in.completion_ids = c.ids;
    in.truncated = c.truncated;
    in.fields = prompts->fields(prompt_of(c).sample_index);
    inputs.push_back(std::move(in));
  }
  const int64_t n = static_cast<int64_t>(completions.size()), K = static_cast<int64_t>(rewards.size());
  // Per completion: its K rewards, then its length and whether it was truncated.
  const int64_t columns = K + 2;
  std::vector<double> mine(static_cast<size_t>(n * columns), 0.0);
  std::string error;
  for (int64_t k = 0; k < K && error.empty(); ++k) {
    try {
      const auto scores = rewards[k]->score(inputs);
      if (static_cast<int64_t>(scores.size()) != n)
        fail("reward ", rewards[k]->name(), " gave ", scores.size(), " values for ", n, " completions");
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(scores[i])) fail("reward ", rewards[k]->name(), " gave ", scores[i], " (not finite) for completion ", i);
        mine[i * columns + k] = scores[i];
      }
    } catch (const std::exception& e) {
      std::ostringstream samples;
      for (const auto& micro : prompts_of_micro)
        for (const auto& p : micro) samples << (samples.tellp() > 0 ? ", " : "") << p.sample_index;
      error = std::string(e.what()) + " (iteration " + std::to_string(step + 1) + ", the rollout of prompts " +
              samples.str() + " on rank " + std::to_string(run.comm().rank()) + ")";
    }
  }
  if (run.comm().any_rank(!error.empty())) {
    if (!error.empty()) fail(error, ": stopping before the step (the last checkpoint holds the last good state)");
    fail("iteration ", step + 1, ": a reward failed on another rank (its error is above): stopping before the step");
  }
  for (int64_t i = 0; i < n; ++i) {
    mine[i * columns + K] = static_cast<double>(completions[i].ids.size());
    mine[i * columns + K + 1] = completions[i].truncated ? 1.0 : 0.0;
  }
  // The global batch: every data-parallel rank's completions, rank after rank.
  const int64_t dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank();
  std::vector<double> counts(static_cast<size_t>(dp), 0.0);
  counts[dp_rank] = static_cast<double>(n);
  counts = run.comm().all_reduce_sum(counts);
  int64_t offset = 0, total = 0;
  for (int64_t r = 0; r < dp; ++r) {
    const auto c = static_cast<int64_t>(counts[r] / static_cast<double>(run.comm().world_size() / dp));
    if (r < dp_rank) offset += c;
    total += c;
  }
  const at::Tensor table = gather_rows(run, mine, offset, total, columns);
  const at::Tensor per_func = table.narrow(1, 0, K).to(at::kFloat);
  const GroupAdvantages scored = group_advantages(per_func, weights, G, config.scale_rewards);
  const at::Tensor advantages = scored.advantages.narrow(0, offset, n);
  rewards_ms = ms_since(began);

  // 3. The training micro-batches: each micro-batch's completions packed into one row.
  began = Clock::now();
  batches.clear();
  std::vector<int64_t> first_of_micro(static_cast<size_t>(micro_batches) + 1, 0);
  for (const auto& c : completions) ++first_of_micro[static_cast<size_t>(c.micro) + 1];
  for (int64_t m = 0; m < micro_batches; ++m) first_of_micro[m + 1] += first_of_micro[m];
  double local_tokens = 0;
  for (int64_t m = 0; m < micro_batches; ++m) {
    const int64_t first = first_of_micro[m], count = first_of_micro[m + 1] - first;
    std::vector<Batch> samples;
    for (int64_t i = first; i < first + count; ++i) {
      const auto& c = completions[i];
      const CollatedPrompt& prompt = prompt_of(c);
      const auto prompt_ids = prompt.batch.at("input_ids")[0];
      const auto ids = at::tensor(c.ids, at::kLong);
      Batch sample = {{"input_ids", at::cat({prompt_ids, ids})},
                      {"labels", at::cat({at::full({prompt_ids.size(0)}, -100, at::kLong), ids})}};
      if (prompt.batch.count("pixel_values")) {
        sample["pixel_values"] = prompt.batch.at("pixel_values");
        sample["image_sizes"] = prompt.batch.at("image_sizes");
      }
      samples.push_back(std::move(sample));
    }
    std::vector<at::Generator> unused;
    Batch batch = conversation::VlmCollator(0, /*pack=*/true).collate(samples, unused);
    const auto labels = batch.at("labels")[0];
    const int64_t L = labels.size(0);
    const auto next = at::cat({labels.narrow(0, 1, L - 1), at::full({1}, -100, at::kLong)});
    const auto cu = batch.at("cu_seqlens");
    const auto completion_of_row = at::repeat_interleave(at::arange(count, at::kLong), cu.narrow(0, 1, count) - cu.narrow(0, 0, count));
    auto mask = (next != -100).to(at::kFloat);
    if (config.mask_truncated_completions) {
      std::vector<float> keep;
      for (int64_t i = first; i < first + count; ++i) keep.push_back(completions[i].truncated ? 0.0f : 1.0f);
      mask = mask * at::tensor(keep, at::kFloat).index_select(0, completion_of_row);
    }
    local_tokens += mask.sum().item<double>();
    batch[kGrpoMaskKey] = mask;
    batch[kGrpoCompletionKey] = completion_of_row;
    batch[kGrpoAdvantagesKey] = advantages.narrow(0, first, count).contiguous();
    batches.push_back(std::move(batch));
  }
  // dapo's token mean over the step: TRL's num_items_in_batch / processes, per micro-batch.
  const double step_tokens = run.comm().all_reduce_sum(local_tokens) / static_cast<double>(run.comm().world_size() / dp);
  const double divisor = std::max(1.0, step_tokens) / static_cast<double>(micro_batches * dp);
  for (auto& batch : batches) batch[kGrpoDapoDivisorKey] = at::tensor({divisor}, at::kDouble);

  // 4. The rollout policy's per-token log-probs (ratios of later iterations) and the reference's (KL).
  const bool needs_old = config.num_iterations > 1, needs_ref = config.beta != 0.0;
  if (needs_old || needs_ref)
    for (auto& batch : batches) {
      Batch on_device = batch;
      for (auto& [key, tensor] : on_device) tensor = tensor.to(run.comm().device());
      if (needs_old)
        batch[kGrpoOldLogProbsKey] = policy_token_log_probs(run.config, *run.model, *run.fsdp, on_device).to(at::kCPU);
      if (needs_ref)
        batch[kGrpoRefLogProbsKey] = reference_token_log_probs(run.config, *run.model, *run.fsdp,
                                                               run.preference_reference.get(), on_device).to(at::kCPU);
    }
  reference_ms = ms_since(began);
  held_data_step = data_step;

  // 5. Metrics over the global batch (TRL's names).
  metrics = nlohmann::json::object();
  for (int64_t k = 0; k < K; ++k) {
    const auto column = table.select(1, k);
    metrics["rewards/" + rewards[k]->name() + "/mean"] = column.mean().item<double>();
    metrics["rewards/" + rewards[k]->name() + "/std"] = unbiased_std(column);
  }
  metrics["reward"] = scored.rewards.to(at::kDouble).mean().item<double>();
  metrics["reward_std"] = unbiased_std(scored.rewards.to(at::kDouble));
  metrics["frac_reward_zero_std"] = scored.std_zero.to(at::kDouble).mean().item<double>();
  const auto lengths = table.select(1, K), truncated = table.select(1, K + 1);
  metrics["completions/mean_length"] = lengths.mean().item<double>();
  metrics["completions/min_length"] = lengths.min().item<double>();
  metrics["completions/max_length"] = lengths.max().item<double>();
  metrics["completions/clipped_ratio"] = truncated.mean().item<double>();
  const auto terminated = lengths.masked_select(truncated == 0);
  metrics["completions/mean_terminated_length"] = terminated.numel() > 0 ? terminated.mean().item<double>() : 0.0;
  const double slowest_s = run.comm().all_reduce_max(std::vector<double>{generate_ms}).at(0) / 1000.0;
  metrics["rollout_tokens_per_s"] = slowest_s > 0 ? lengths.sum().item<double>() / slowest_s : 0.0;

  // 6. The rollout's completions to <output_dir>/rollouts/iter_<N>.jsonl (every rank's part, merged
  // by rank 0 in global order), and the first few as TensorBoard texts.
  const fs::path dir = fs::path(run.config.logging.output_dir) / "rollouts";
  const std::string name = "iter_" + std::to_string(step + 1) + ".jsonl";
  std::string lines;
  for (int64_t i = 0; i < n; ++i) {
    const auto& c = completions[i];
    const CollatedPrompt& prompt = prompt_of(c);
    const auto prompt_ids = prompt.batch.at("input_ids")[0].contiguous();
    nlohmann::json r = {{"index", offset + i}, {"rank", run.comm().rank()}, {"micro_batch", c.micro},
                        {"sample_index", prompt.sample_index}, {"generation", c.generation},
                        {"seed", prompt.rollout_seed + c.generation}, {"prompt", inputs[i].prompt},
                        {"completion", c.text}, {"truncated", c.truncated},
                        {"prompt_ids", std::vector<int64_t>(prompt_ids.data_ptr<int64_t>(),
                                                            prompt_ids.data_ptr<int64_t>() + prompt_ids.numel())},
                        {"completion_ids", c.ids}};
    nlohmann::json per = nlohmann::json::object();
    for (int64_t k = 0; k < K; ++k) per[rewards[k]->name()] = table[offset + i][k].item<double>();
    r["rewards"] = per;
    r["reward"] = scored.rewards[offset + i].item<double>();
    r["advantage"] = scored.advantages[offset + i].item<double>();
    lines += r.dump() + "\n";
  }
  std::string problem;
  if (run.is_rank0()) {
    problem = not_a_directory(dir.string());
    if (problem.empty()) fs::create_directories(dir);
  }
  if (run.comm().any_rank(!problem.empty()))
    fail(dir.string(), " is ", problem.empty() ? "unusable on rank 0" : problem, ": the rollouts are written there");
  const std::string part = (dir / ("." + name + ".rank" + std::to_string(run.comm().rank()))).string();
  write_file_no_follow(part, lines, "a rank's rollout");
  run.comm().barrier();
  if (!run.is_rank0()) return;
  std::string merged;
  for (int r = 0; r < run.comm().world_size(); ++r) {
    const std::string path = (dir / ("." + name + ".rank" + std::to_string(r))).string();
    // Ranks of one data-parallel group hold the same completions: the first one's are kept.
    const std::string text = read_user_file(path, "a rank's rollout", int64_t{1} << 30);
    if (r % (run.comm().world_size() / dp) == 0) merged += text;
    fs::remove(path);
  }
  write_file_no_follow((dir / name).string(), merged, "rollouts/" + name);
  if (config.log_completions > 0) {
    texts = std::make_unique<SampleRecord>();
    texts->iteration = step + 1;
    texts->dir = (dir / name).string();
    texts->seconds = (generate_ms + rewards_ms) / 1000.0;
    for (int64_t i = 0; i < std::min<int64_t>(n, config.log_completions); ++i) {
      std::string rewards_text;
      for (int64_t k = 0; k < K; ++k)
        rewards_text += format("%s%s %.4g", k ? ", " : "", rewards[k]->name().c_str(), table[offset + i][k].item<double>());
      texts->texts.push_back({"rollouts/completion_" + std::to_string(i),
                              "**prompt** " + inputs[i].prompt + "\n\n**completion** " + completions[i].text +
                                  "\n\n**rewards** " + rewards_text +
                                  format(" (advantage %.4g)", scored.advantages[offset + i].item<double>())});
    }
  }
}

}  // namespace mmtrain::rl
