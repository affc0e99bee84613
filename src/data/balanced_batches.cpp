#include "data/balanced_batches.h"

#include "core/checked_math.h"
#include "core/error.h"
#include "core/statistics.h"

#include <algorithm>
#include <numeric>

namespace mmtrain {
namespace {

struct Bin {
  std::vector<int64_t> positions;
  int64_t tokens = 0;
  double cost = 0;
  int64_t first = 0;  // the smallest position: the tie-break that keeps the split deterministic
};

void add(Bin& bin, int64_t position, const SampleLoad& load) {
  if (bin.positions.empty() || position < bin.first) bin.first = position;
  bin.positions.push_back(position);
  bin.tokens += load.tokens;
  bin.cost += load.cost;
}

// Positions by decreasing tokens, then increasing position.
std::vector<int64_t> by_tokens(std::vector<int64_t> positions, const std::vector<SampleLoad>& samples) {
  std::stable_sort(positions.begin(), positions.end(),
                   [&](int64_t a, int64_t b) { return samples[a].tokens > samples[b].tokens; });
  return positions;
}

// The samples at `positions` packed into bins of at most `budget` tokens.
std::vector<Bin> first_fit_decreasing(const std::vector<SampleLoad>& samples, const std::vector<int64_t>& positions,
                                      int64_t budget) {
  std::vector<Bin> bins;
  for (int64_t p : by_tokens(positions, samples)) {
    auto fits = std::find_if(bins.begin(), bins.end(), [&](const Bin& b) { return b.tokens + samples[p].tokens <= budget; });
    if (fits == bins.end()) fits = bins.insert(bins.end(), Bin{});
    add(*fits, p, samples[p]);
  }
  return bins;
}

// Splits the bin with the most samples (then the most tokens, then the first) in two; false when
// every bin holds one sample.
bool split_one(std::vector<Bin>& bins, const std::vector<SampleLoad>& samples) {
  auto widest = std::max_element(bins.begin(), bins.end(), [](const Bin& a, const Bin& b) {
    if (a.positions.size() != b.positions.size()) return a.positions.size() < b.positions.size();
    if (a.tokens != b.tokens) return a.tokens < b.tokens;
    return a.first > b.first;
  });
  if (widest->positions.size() < 2) return false;
  Bin halves[2];
  int turn = 0;
  for (int64_t p : by_tokens(widest->positions, samples)) add(halves[turn ^= 1], p, samples[p]);
  *widest = halves[0];
  bins.push_back(halves[1]);
  return true;
}

// Rank r takes `bin` as its next micro-batch, its samples in stream order.
void place(StepSplit& split, int rank, Bin& bin) {
  std::sort(bin.positions.begin(), bin.positions.end());
  split.micro_batches[rank].push_back(bin.positions);
  split.rank_cost[rank] += bin.cost;
}

// Balanced: the samples by decreasing cost, each to the least-loaded rank (longest-processing-time);
// each rank's samples packed into bins; the ranks with fewer bins split theirs up to the most any
// rank has. Empty when some rank has fewer samples than that count (the caller falls back).
std::vector<std::vector<Bin>> balance_samples(const std::vector<SampleLoad>& samples, const std::vector<int64_t>& kept,
                                              int dp_world, int64_t budget) {
  std::vector<int64_t> order = kept;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return samples[a].cost > samples[b].cost; });
  std::vector<std::vector<int64_t>> owned(dp_world);
  std::vector<double> load(dp_world, 0.0);
  for (int64_t p : order) {
    const int rank = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owned[rank].push_back(p);
    load[rank] += samples[p].cost;
  }
  std::vector<std::vector<Bin>> bins(dp_world);
  size_t most = 0;
  for (int r = 0; r < dp_world; ++r) {
    std::sort(owned[r].begin(), owned[r].end());
    bins[r] = first_fit_decreasing(samples, owned[r], budget);
    most = std::max(most, bins[r].size());
  }
  for (int r = 0; r < dp_world; ++r) {
    if (owned[r].size() < most) return {};
    while (bins[r].size() < most) split_one(bins[r], samples);
  }
  return bins;
}

}  // namespace

int64_t StepSplit::micro_batches_per_rank() const {
  return micro_batches.empty() ? 0 : static_cast<int64_t>(micro_batches[0].size());
}

double StepSplit::imbalance() const {
  const double average = rank_cost.empty() ? 0.0 : mean(rank_cost);
  return average > 0 ? *std::max_element(rank_cost.begin(), rank_cost.end()) / average : 1.0;
}

double StepSplit::balance_bound() const {
  const double average = rank_cost.empty() ? 0.0 : mean(rank_cost);
  return average > 0 ? std::max(average, max_sample_cost) / average : 1.0;
}

double StepSplit::budget_fill() const {
  const double capacity = static_cast<double>(budget_tokens) * static_cast<double>(micro_batches_per_rank()) *
                          static_cast<double>(micro_batches.size());
  return capacity > 0 ? static_cast<double>(tokens) / capacity : 0.0;
}

StepSplit split_step(const std::vector<SampleLoad>& samples, int dp_world, int64_t budget_tokens, bool balance,
                     bool skip_over_budget, const std::function<std::string(int64_t)>& describe,
                     const std::string& step_name) {
  if (budget_tokens < 1) fail("micro_batch_tokens must be >= 1, found ", budget_tokens);
  const std::string step = step_name.empty() ? "the step" : step_name;
  StepSplit split;
  std::vector<int64_t> kept;
  for (int64_t p = 0; p < static_cast<int64_t>(samples.size()); ++p) {
    if (samples[p].tokens <= budget_tokens) {
      kept.push_back(p);
    } else if (skip_over_budget) {
      split.skipped.push_back(p);
    } else {
      fail("data.dataloader_param.micro_batch_tokens: ",
           describe ? describe(p) : "sample " + std::to_string(p) + " of the step", " has ", samples[p].tokens,
           " tokens, over the budget of ", budget_tokens,
           ": raise the budget, or set data.dataloader_param.over_budget_samples: skip");
    }
  }
  const auto count = static_cast<int64_t>(kept.size());
  if (dp_world < 1 || count < dp_world)
    fail("micro_batch_tokens: ", step, ": its ", count, " samples",
         split.skipped.empty() ? "" : " (after skipping " + std::to_string(split.skipped.size()) + " over the budget)",
         " cannot give each of ", dp_world, " data-parallel rank(s) a micro-batch");
  split.budget_tokens = budget_tokens;
  for (int64_t p : kept) {
    split.tokens = checked_add(split.tokens, samples[p].tokens, "micro_batch_tokens: " + step + "'s tokens");
    split.max_sample_cost = std::max(split.max_sample_cost, samples[p].cost);
  }
  split.micro_batches.assign(dp_world, {});
  split.rank_cost.assign(dp_world, 0.0);
  if (balance) {
    auto per_rank_bins = balance_samples(samples, kept, dp_world, budget_tokens);
    if (!per_rank_bins.empty()) {
      for (int r = 0; r < dp_world; ++r)
        for (Bin& bin : per_rank_bins[r]) place(split, r, bin);
      return split;
    }
  }
  // Whole bins to ranks: the unbalanced split, and the balanced one's fallback.
  std::vector<Bin> bins = first_fit_decreasing(samples, kept, budget_tokens);
  while (bins.size() % static_cast<size_t>(dp_world) != 0)
    if (!split_one(bins, samples))  // only with skipped samples: G itself is a multiple of the world
      fail("micro_batch_tokens: ", step, ": its ", count, " samples left after skipping ", split.skipped.size(),
           " over the budget each need a micro-batch of their own, and ", count, " micro-batches do not split evenly "
           "over ", dp_world, " data-parallel ranks (raise the budget)");
  const size_t per_rank = bins.size() / static_cast<size_t>(dp_world);
  std::vector<size_t> order(bins.size());
  std::iota(order.begin(), order.end(), 0);
  if (balance)
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      if (bins[a].cost != bins[b].cost) return bins[a].cost > bins[b].cost;
      return bins[a].first < bins[b].first;
    });
  for (size_t i = 0; i < order.size(); ++i) {
    int rank = static_cast<int>(i % static_cast<size_t>(dp_world));
    if (balance) {
      rank = -1;
      for (int r = 0; r < dp_world; ++r)
        if (split.micro_batches[r].size() < per_rank && (rank < 0 || split.rank_cost[r] < split.rank_cost[rank])) rank = r;
    }
    place(split, rank, bins[order[i]]);
  }
  return split;
}

}  // namespace mmtrain
