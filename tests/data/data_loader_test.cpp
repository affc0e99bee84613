// The data loader: background workers change when micro-batches are loaded, never which ones or
// what they hold; loading runs ahead of the training thread; errors surface at the micro-batch
// that caused them. Also the collators' own collate_param keys.
#include "data/data_loader.h"
#include "data/data_config.h"
#include "models/model_config.h"
#include "test_util.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

namespace mmtrain {
namespace {

using mmtrain::testing::error_of;

// Sample i is [i, i + 1, i + 2]; get(fail_at) throws; counts calls.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n, int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  Batch get(int64_t index) const override {
    ++calls;
    if (index == fail_at_) fail("sample ", index, " is broken");
    return {{"x", at::arange(index, index + 3, at::kFloat)}};
  }
  mutable std::atomic<int> calls{0};

 private:
  int64_t n_, fail_at_;
};

// Stacks the samples and adds collator noise, so that a wrong generator would show.
class NoisyCollator : public Collator {
 public:
  Batch collate(const std::vector<Batch>& samples, std::vector<at::Generator>& generators) const override {
    std::vector<at::Tensor> xs, noise;
    for (size_t b = 0; b < samples.size(); ++b) {
      xs.push_back(samples[b].at("x"));
      noise.push_back(at::randn(samples[b].at("x").sizes(), generators[b]));
    }
    return {{"x", at::stack(xs)}, {"noise", at::stack(noise)}};
  }
};

DataPipeline pipeline(std::shared_ptr<Dataset> dataset, int64_t accum) {
  SamplerOptions o;
  o.num_samples = dataset->size();
  o.micro_batch_size = 2;
  o.gradient_accumulation_steps = accum;
  o.shuffle = true;
  o.seed = 11;
  DataPipeline p;
  p.dataset = std::move(dataset);
  p.collator = std::make_shared<NoisyCollator>();
  p.sampler = GlobalBatchSampler(o);
  p.seed = 11;
  return p;
}

TEST(DataLoader, WorkersLoadExactlyWhatTheTrainingThreadWould) {
  const auto data = pipeline(std::make_shared<CountingDataset>(23), 3);
  for (int workers : {0, 1, 3}) {
    LoaderOptions o;
    o.num_workers = workers;
    DataLoader loader(data, 2, 9, o);
    for (int64_t step = 2; step < 9; ++step)
      for (int64_t micro = 0; micro < 3; ++micro) {
        const auto got = loader.next(step, micro);
        const auto want = data.micro_batch(step, micro);
        EXPECT_TRUE(at::equal(got.at("x"), want.at("x"))) << workers << " workers, step " << step;
        EXPECT_TRUE(at::equal(got.at("noise"), want.at("noise"))) << workers << " workers, step " << step;
      }
    EXPECT_CONTAINS(error_of([&] { loader.next(9, 0); }), "(past the last step)");
  }
}

TEST(DataLoader, LoadsAheadBeforeBeingAsked) {
  auto dataset = std::make_shared<CountingDataset>(40);
  const auto data = pipeline(dataset, 1);
  LoaderOptions o;
  o.num_workers = 2;
  o.prefetch_factor = 2;
  DataLoader loader(data, 0, 10, o);
  // 2 workers x 2 micro-batches x 2 samples load without any next() call.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (dataset->calls < 8 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(dataset->calls.load(), 8);  // and no further: the look-ahead is bounded
  loader.next(0, 0);
  while (dataset->calls < 10 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(dataset->calls.load(), 10);
}

TEST(DataLoader, AFailureSurfacesAtItsMicroBatchAndOrderIsChecked) {
  // Find the step whose micro-batch reads sample 5 under the shuffle.
  auto dataset = std::make_shared<CountingDataset>(20, 5);
  const auto data = pipeline(dataset, 1);
  int64_t bad_step = -1;
  for (int64_t step = 0; step < 10 && bad_step < 0; ++step)
    for (int64_t index : data.sampler.indices(step, 0))
      if (index == 5) bad_step = step;
  ASSERT_GE(bad_step, 0);
  LoaderOptions o;
  o.num_workers = 2;
  DataLoader loader(data, 0, 10, o);
  for (int64_t step = 0; step < bad_step; ++step) EXPECT_NO_THROW(loader.next(step, 0));
  EXPECT_CONTAINS(error_of([&] { loader.next(bad_step, 0); }), "sample 5 is broken");

  DataLoader fresh(data, 0, 10, o);
  EXPECT_CONTAINS(error_of([&] { fresh.next(1, 0); }), "asked for step 1 micro-batch 0, but the next one is step 0");
}

// Token-budget steps have their own micro-batch counts: the loader follows them, with or without
// workers, and hands over exactly what the pipeline builds.
TEST(DataLoader, FollowsTokenBudgetStepsOfVaryingLength) {
  SamplerOptions o;
  o.num_samples = 40;
  o.gradient_accumulation_steps = 4;
  o.dp_world = 2;
  o.dp_rank = 1;
  o.shuffle = true;
  o.seed = 11;
  o.micro_batch_tokens = 7;
  DataPipeline data;
  data.dataset = std::make_shared<CountingDataset>(40);
  data.collator = std::make_shared<NoisyCollator>();
  data.sampler = GlobalBatchSampler(o, [](int64_t index) { return SampleLoad{1 + index % 7, 1.0 + index % 7}; });
  data.seed = 11;
  std::set<int64_t> counts;
  for (int workers : {0, 2}) {
    LoaderOptions options;
    options.num_workers = workers;
    DataLoader loader(data, 1, 7, options);
    for (int64_t step = 1; step < 7; ++step) {
      counts.insert(data.sampler.micro_batches(step));
      for (int64_t micro = 0; micro < data.sampler.micro_batches(step); ++micro) {
        const auto got = loader.next(step, micro);
        EXPECT_TRUE(at::equal(got.at("noise"), data.micro_batch(step, micro).at("noise"))) << workers << " " << step;
      }
    }
    EXPECT_CONTAINS(error_of([&] { loader.next(7, 0); }), "(past the last step)");
  }
  EXPECT_GT(counts.size(), 1u) << "the steps should differ in micro-batch count";
}

TEST(Collators, CheckTheirCollateParamKeys) {
  DataConfig data;
  ModelConfig model;
  data.loader.collate_param = {{"model_name", "pixtral"}, {"pad_tokn_id", 3}};
  EXPECT_CONTAINS(error_of([&] { collator_registry().get("pixtral", "test")(data, model); }),
                  "data.dataloader_param.collate_param.pad_tokn_id: unknown key for collator pixtral (did you mean "
                  "'pad_token_id'?)");
  data.loader.collate_param = {{"model_name", "causal_lm"}, {"pad_token_id", 3}};
  EXPECT_CONTAINS(error_of([&] { collator_registry().get("causal_lm", "test")(data, model); }),
                  "data.dataloader_param.collate_param.pad_token_id: unknown key for collator causal_lm");
  data.loader.collate_param = {{"model_name", "magihuman"}, {"ignore_pad_token_for_loss", true}};
  EXPECT_CONTAINS(error_of([&] { collator_registry().get("magihuman", "test")(data, model); }),
                  "ignore_pad_token_for_loss: MagiHuman batches have no pad tokens");
}

}  // namespace
}  // namespace mmtrain
