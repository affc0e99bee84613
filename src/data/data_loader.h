// The data of a run as one data-parallel rank sees it (dataset, collator, sampler) and the loader
// that prepares its micro-batches ahead of the training thread.
#pragma once
#include "data/dataset.h"
#include "data/sampler.h"

#include <memory>
#include <thread>
#include <vector>

namespace mmtrain {

struct DataPipeline {
  std::shared_ptr<Dataset> dataset;
  std::shared_ptr<Collator> collator;
  GlobalBatchSampler sampler;
  uint64_t seed = 0;  // training.seed: the collator's noise is drawn from (seed, stream position)

  // Micro-batch `micro` (0-based, < gradient_accumulation_steps) of optimizer step `step`.
  Batch micro_batch(int64_t step, int64_t micro) const;
};

struct LoaderOptions {
  int num_workers = 0;      // 0: each micro-batch is loaded when the training thread asks for it
  int prefetch_factor = 2;  // micro-batches in flight per worker
  bool pin_memory = false;  // page-locked tensors (for a CUDA copy; the caller decides)
};

// The micro-batches of steps [first_step, end_step) in training order (step by step, micro-batch
// 0 .. accumulation-1 within a step), each equal to DataPipeline::micro_batch's: workers change
// when a batch is loaded, never which one or what it holds. With num_workers > 0, up to
// num_workers x prefetch_factor micro-batches are loaded ahead on background threads while the
// training thread computes; a failure while loading one is raised when that one is asked for.
class DataLoader {
 public:
  DataLoader(const DataPipeline& pipeline, int64_t first_step, int64_t end_step, LoaderOptions options);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next micro-batch; (step, micro) must be the next one in order (a check, not a seek).
  Batch next(int64_t step, int64_t micro);

 private:
  struct Queue;
  Batch load(int64_t sequence) const;  // sequence: micro-batches since first_step
  void work();                         // a worker thread's loop
  void submit_ahead();

  const DataPipeline& pipeline_;
  int64_t first_step_;
  int64_t accumulation_;
  int64_t total_;      // micro-batches in [first_step, end_step)
  int64_t consumed_ = 0;
  int64_t submitted_ = 0;
  LoaderOptions options_;
  std::unique_ptr<Queue> queue_;
  std::vector<std::thread> workers_;
};

}  // namespace mmtrain
