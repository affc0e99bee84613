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

  // Micro-batch `micro` (0-based, < micro_batches(step)) of optimizer step `step`.
  Batch micro_batch(int64_t step, int64_t micro) const;
};

// A micro-batch's place in training order.
struct MicroBatchId {
  int64_t step = 0;
  int64_t micro = 0;
};

struct LoaderOptions {
  int num_workers = 0;      // 0: each micro-batch is loaded when the training thread asks for it
  int prefetch_factor = 2;  // micro-batches in flight per worker
  bool pin_memory = false;  // page-locked tensors (for a CUDA copy; the caller decides)
};

// The micro-batches of steps [first_step, end_step) in training order (step by step, micro-batch
// 0 .. sampler.micro_batches(step) - 1 within a step), each equal to DataPipeline::micro_batch's: workers change
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
  Batch load(MicroBatchId id) const;
  void work();  // a worker thread's loop
  void stop();  // stops and joins the workers
  void submit_ahead();
  // The micro-batch after `id` in training order ({end_step, 0} after the last).
  MicroBatchId after(MicroBatchId id) const;

  const DataPipeline& pipeline_;
  int64_t end_step_;
  // Sequence numbers count micro-batches since first_step: the next one to hand out, and the
  // next one to queue for the workers, each with its id.
  int64_t consumed_ = 0, submitted_ = 0;
  MicroBatchId next_, next_submitted_;
  LoaderOptions options_;
  std::unique_ptr<Queue> queue_;
  std::vector<std::thread> workers_;
};

}  // namespace mmtrain
