#include "train/evaluate.h"

#include "core/checked_math.h"
#include "core/error.h"
#include "core/random.h"
#include "core/text.h"
#include "data/held_out.h"
#include "io/user_file.h"
#include "nn/preference_loss.h"
#include "train/build.h"
#include "train/objective.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>

namespace mmtrain {

namespace {

// The evaluation noise's own stream: (seed, timestep index) picks it, the sample's dataset index
// the generator within it; never a training stream.
constexpr uint64_t kEvalNoiseSalt = 0x6576616c6e6f6973ULL;  // "evalnois"

at::Generator eval_generator(uint64_t seed, int64_t timestep_index, int64_t sample) {
  return indexed_generator(splitmix64_mix(seed ^ kEvalNoiseSalt ^ static_cast<uint64_t>(timestep_index + 1)),
                           static_cast<uint64_t>(sample));
}

std::string quantile_name(double q) { return "t" + format("%g", q); }

}  // namespace

Evaluator::Evaluator(const Run& run, bool record_held_out) : config_(&run.config) {
  const Config& c = run.config;
  const auto& t = c.training;
  const std::string where = "config " + c.source_path + ": ";
  dataset_ = build_validation_dataset(c, run.data.dataset);
  if (!dataset_) fail(where, "training.eval_interval / eval_at_start need a validation set: data.validation or "
                             "data.validation_split");
  if (dataset_->size() == 0) fail(where, "the validation set is empty");
  if (record_held_out && run.is_rank0() && c.data.validation_split > 0.0) {
    const auto* subset = dynamic_cast<const SubsetDataset*>(dataset_.get());
    nlohmann::json held = nlohmann::json::array();
    for (int64_t i = 0; i < subset->size(); ++i) held.push_back(subset->base_index(i));
    std::filesystem::create_directories(c.logging.output_dir);
    write_file_no_follow(c.logging.output_dir + "/validation_indices.json",
                         nlohmann::json({{"validation_split", c.data.validation_split},
                                         {"seed", c.training.seed},
                                         {"indices", held}})
                                 .dump() +
                             "\n",
                         "validation_indices.json");
  }
  const auto& data = c.data.validation.empty() ? c.data : c.data.validation_data();
  collator_ = collator_registry().get(data.collate_model_name, where + "data.dataloader_param.collate_param.model_name")(
      data, c.model);
  micro_ = t.eval_batch_size > 0 ? t.eval_batch_size : t.micro_batch_size;
  if (const int64_t budget = c.data.loader.micro_batch_tokens; budget > 0) keep_within_budget(run, budget);
  const int64_t per_global = micro_ * run.mesh->dp_size();
  const int64_t full_pass = (dataset_->size() + per_global - 1) / per_global;
  if (t.eval_iters == -1) {
    global_batches_ = full_pass;
  } else if (checked_mul(t.eval_iters, per_global, where + "training.eval_iters x samples per global batch") >
             dataset_->size()) {
    fail(where, "training.eval_iters ", t.eval_iters, " global batches of ", per_global, " samples (eval_batch_size ",
         micro_, " x ", run.mesh->dp_size(), " data-parallel ranks) need ", t.eval_iters * per_global,
         " validation samples; the validation set holds ", dataset_->size(),
         " (evaluation never wraps around: use -1 for one full pass)");
  } else {
    global_batches_ = t.eval_iters;
  }
  std::map<std::string, double> named;  // record key -> the timestep it names: each key one timestep
  for (const double q : t.eval_timesteps) {
    const auto sigma = collator_->timestep_quantile(q);
    if (!sigma) break;  // no timesteps: one pass
    if (const auto [it, fresh] = named.emplace(quantile_name(q), q); !fresh)
      fail(where, "training.eval_timesteps ", format("%.17g", it->second), " and ", format("%.17g", q), " both name ",
           "the record key eval_loss_", it->first, " (keys keep 6 significant digits): give timesteps that differ there");
    quantiles_.push_back(q);
    sigmas_.push_back(*sigma);
  }
  run.log(format("evaluation: %lld validation samples, %lld global batch(es) of %lld per evaluation%s%s",
                 static_cast<long long>(dataset_->size()), static_cast<long long>(global_batches_),
                 static_cast<long long>(per_global), sigmas_.empty() ? "" : ", each sample at ",
                 sigmas_.empty() ? "" : (std::to_string(sigmas_.size()) + " fixed timesteps").c_str()));
}

void Evaluator::keep_within_budget(const Run& run, int64_t budget) {
  const Config& c = run.config;
  const std::string where = "config " + c.source_path + ": ";
  // Under a token budget an evaluation micro-batch is one sample, which must fit the budget as a
  // training micro-batch must (data.dataloader_param.over_budget_samples: error or skip).
  if (micro_ != 1)
    fail(where, "training.eval_batch_size ", micro_, " with data.dataloader_param.micro_batch_tokens ", budget,
         ": under a token budget each evaluation micro-batch is one sample; leave eval_batch_size at 0 or 1");
  std::vector<int64_t> fitting;
  int64_t skipped = 0;
  for (int64_t i = 0; i < dataset_->size(); ++i) {
    const auto tokens = dataset_->sample_tokens(i);
    if (!tokens) fail(where, "the validation set cannot say how many tokens ", dataset_->describe(i), " has, which ",
                      "data.dataloader_param.micro_batch_tokens needs");
    if (*tokens <= budget) {
      fitting.push_back(i);
    } else if (c.data.loader.over_budget_samples == "skip") {
      ++skipped;
    } else {
      fail(where, "validation sample ", dataset_->describe(i), " has ", *tokens, " tokens, over ",
           "data.dataloader_param.micro_batch_tokens ", budget, " (over_budget_samples: skip leaves it out, as in training)");
    }
  }
  if (skipped == 0) return;
  if (fitting.empty()) fail(where, "every validation sample is over data.dataloader_param.micro_batch_tokens ", budget);
  run.log(format("evaluation: over_budget_samples: skip: %lld of %lld validation samples are over the token budget "
                 "%lld and left out", static_cast<long long>(skipped), static_cast<long long>(dataset_->size()),
                 static_cast<long long>(budget)));
  dataset_ = std::make_shared<SubsetDataset>(dataset_, fitting);
}

bool Evaluator::due(int64_t iteration) const {
  const auto& t = config_->training;
  if (iteration == 0) return t.eval_at_start;
  return t.eval_interval > 0 && iteration % t.eval_interval == 0;
}

void eval_losses(const EvalSums& reduced, const std::vector<double>& quantiles, const std::vector<double>& sigmas,
                 const std::vector<std::string>& term_names, EvalRecord& record) {
  const size_t slots = reduced.sums.size(), terms = slots ? reduced.sums[0].size() : 0;
  std::vector<double> term_mean(terms, 0.0);
  double loss = 0;
  for (size_t j = 0; j < slots; ++j) {
    double at_timestep = 0;
    for (size_t k = 0; k < terms; ++k) {
      const double count = reduced.counts[j][k];
      const double mean = count > 0 ? reduced.sums[j][k] / count : 0.0;
      at_timestep += mean;
      term_mean[k] += mean / static_cast<double>(slots);
    }
    loss += at_timestep / static_cast<double>(slots);
    if (!quantiles.empty()) record.timesteps.emplace_back(quantile_name(quantiles[j]), at_timestep);
  }
  record.loss = loss;
  record.sigmas = sigmas;
  if (terms > 1)
    for (size_t k = 0; k < terms; ++k)
      record.terms.emplace_back(k < term_names.size() ? term_names[k] : "term" + std::to_string(k), term_mean[k]);
  double supervised = 0;
  for (size_t k = 0; k < terms && slots; ++k) supervised += reduced.counts[0][k];
  record.supervised = static_cast<int64_t>(supervised);
  if (quantiles.empty()) record.ppl = std::exp(std::min(20.0, loss));
}

std::vector<int64_t> Evaluator::rank_samples(int64_t g, int dp_rank, int dp, bool& padding) const {
  std::vector<int64_t> mine;
  for (int64_t i = 0; i < micro_; ++i) {
    const int64_t position = g * micro_ * dp + dp_rank * micro_ + i;
    if (position < dataset_->size()) mine.push_back(position);
  }
  padding = mine.empty();
  if (padding) mine.push_back(0);
  return mine;
}

EvalRecord Evaluator::evaluate_objective(Run& run, int64_t iteration) {
  const auto began = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  const auto forward = objective_forward(run.config, run.preference_reference);
  const int dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank();
  double loss_sum = 0, tokens = 0;
  std::map<std::string, double> metric_sums;
  for (int64_t g = 0; g < global_batches_; ++g) {
    bool padding = false;
    std::vector<Batch> samples;
    // A diffusion model's pairs are noised: the same noise at every evaluation.
    std::vector<at::Generator> generators;
    for (const int64_t index : rank_samples(g, dp_rank, dp, padding)) {
      samples.push_back(dataset_->get(index));
      generators.push_back(eval_generator(run.config.training.seed, 0, index));
    }
    Batch batch = collator_->collate(samples, generators);
    for (auto& [key, tensor] : batch) tensor = tensor.to(run.comm().device());
    const ModelOutput out = forward(*run.model, *run.fsdp, batch);
    run.fsdp->finish_forward_only();
    if (padding) continue;
    const double pairs = out.metrics.at(kPairCountMetric);
    loss_sum += out.loss.item<double>() * pairs;
    tokens += run.model->loss_counts(batch).at(0);
    for (const auto& [key, value] : out.metrics) metric_sums[key] += value;
  }
  run.fsdp->take_comm_wait_ms();  // the evaluation's waits are not the next step's
  // [loss sum, tokens, the metric sums by key]: every rank has the same keys (a padding rank none:
  // it adds zeros); a context-parallel group holds one micro-batch, counted world / dp times.
  const auto& keys = objective_metric_names(run.config);
  std::vector<double> flat = {loss_sum, tokens};
  for (const auto& key : keys) flat.push_back(metric_sums.count(key) ? metric_sums.at(key) : 0.0);
  flat = run.comm().all_reduce_sum(flat);
  const double replicas = static_cast<double>(run.comm().world_size() / dp);
  for (double& value : flat) value /= replicas;
  std::map<std::string, double> totals;
  for (size_t i = 0; i < keys.size(); ++i) totals[keys[i]] = flat[2 + i];
  const double pairs = totals.at(kPairCountMetric);
  EvalRecord record;
  record.iteration = iteration;
  record.loss = pairs > 0 ? flat[0] / pairs : 0.0;
  record.supervised = static_cast<int64_t>(flat[1]);
  record.samples = static_cast<int64_t>(pairs);
  record.objective = objective_metrics(totals);
  record.time_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  return record;
}

EvalRecord Evaluator::evaluate(Run& run, int64_t iteration) {
  if (run.config.training.objective != "sft") return evaluate_objective(run, iteration);
  const auto began = std::chrono::steady_clock::now();
  at::NoGradGuard no_grad;
  Model& model = *run.model;
  const int dp = run.mesh->dp_size(), dp_rank = run.mesh->dp_rank();
  const int world = run.comm().world_size();
  const size_t slots = sigmas_.empty() ? 1 : sigmas_.size();
  const auto term_names = model.loss_term_names();
  const size_t terms = std::max<size_t>(1, term_names.size());
  EvalSums local{std::vector<std::vector<double>>(slots, std::vector<double>(terms, 0.0)),
                 std::vector<std::vector<double>>(slots, std::vector<double>(terms, 0.0))};
  int64_t samples_read = 0;
  for (int64_t g = 0; g < global_batches_; ++g) {
    bool padding = false;
    const std::vector<int64_t> mine = rank_samples(g, dp_rank, dp, padding);
    std::vector<Batch> samples;
    for (const int64_t index : mine) samples.push_back(dataset_->get(index));
    if (!padding) samples_read += static_cast<int64_t>(mine.size());
    for (size_t j = 0; j < slots; ++j) {
      std::vector<at::Generator> generators;
      for (const int64_t index : mine)
        generators.push_back(eval_generator(run.config.training.seed, static_cast<int64_t>(j), index));
      Batch batch = sigmas_.empty() ? collator_->collate(samples, generators)
                                    : collator_->collate_at_timestep(samples, generators, sigmas_[j]);
      for (auto& [key, tensor] : batch) tensor = tensor.to(run.comm().device());
      const auto counts = model.loss_counts(batch);
      if (counts.size() != terms)
        fail("evaluation: the model reports ", counts.size(), " loss count(s) for ", terms, " term(s) (Model::loss_counts)");
      batch[kLossNormalizerKey] = at::ones({static_cast<int64_t>(terms)}, at::kDouble);  // sums, not means
      run.fsdp->begin_forward();
      check_sft_batch(batch);
      const ModelOutput out = model.forward(batch);
      run.fsdp->finish_forward_only();
      if (padding) continue;
      for (size_t k = 0; k < terms; ++k) {
        const at::Tensor& sum = out.term_losses.empty() ? out.loss : out.term_losses.at(k);
        local.sums[j][k] += sum.item<double>();
        local.counts[j][k] += counts[k];
      }
    }
  }
  run.fsdp->take_comm_wait_ms();  // the evaluation's waits are not the next step's
  // One vector over the world: [sums..., counts..., samples]; a context-parallel group holds one
  // micro-batch, so every value is counted world / dp times.
  std::vector<double> flat;
  for (const auto* table : {&local.sums, &local.counts})
    for (const auto& row : *table) flat.insert(flat.end(), row.begin(), row.end());
  flat.push_back(static_cast<double>(samples_read));
  flat = run.comm().all_reduce_sum(flat);
  const double replicas = static_cast<double>(world / dp);
  EvalSums reduced = local;
  size_t at = 0;
  for (auto* table : {&reduced.sums, &reduced.counts})
    for (auto& row : *table)
      for (double& value : row) value = flat[at++] / replicas;

  EvalRecord record;
  record.iteration = iteration;
  eval_losses(reduced, quantiles_, sigmas_, term_names, record);
  record.samples = static_cast<int64_t>(flat.back() / replicas);
  record.time_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  return record;
}

}  // namespace mmtrain
