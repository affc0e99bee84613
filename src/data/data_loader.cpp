#include "data/data_loader.h"

#include "core/error.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>

namespace mmtrain {

Batch DataPipeline::micro_batch(int64_t step, int64_t micro) const {
  std::vector<Batch> samples;
  for (int64_t index : sampler.indices(step, micro)) samples.push_back(dataset->get(index));
  auto generator = collate_generator(seed, sampler.first_position(step, micro));
  return collator->collate(samples, generator);
}

struct DataLoader::Queue {
  std::mutex mutex;
  std::condition_variable work_ready;    // a sequence number was queued, or stopping
  std::condition_variable result_ready;  // a micro-batch (or its error) is in `results`
  std::deque<int64_t> pending;
  struct Result {
    Batch batch;
    std::exception_ptr error;
  };
  std::map<int64_t, Result> results;
  bool stopping = false;
};

DataLoader::DataLoader(const DataPipeline& pipeline, int64_t first_step, int64_t end_step, LoaderOptions options)
    : pipeline_(pipeline),
      first_step_(first_step),
      accumulation_(pipeline.sampler.options().gradient_accumulation_steps),
      total_(std::max<int64_t>(0, end_step - first_step) * accumulation_),
      options_(options),
      queue_(std::make_unique<Queue>()) {
  if (options_.num_workers < 0 || options_.prefetch_factor < 1)
    fail("data loader: num_workers must be >= 0 and prefetch_factor >= 1, found ", options_.num_workers, " and ",
         options_.prefetch_factor);
  for (int w = 0; w < options_.num_workers; ++w) workers_.emplace_back([this] { work(); });
  submit_ahead();
}

DataLoader::~DataLoader() {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stopping = true;
  }
  queue_->work_ready.notify_all();
  for (auto& worker : workers_) worker.join();
}

Batch DataLoader::load(int64_t sequence) const {
  auto batch = pipeline_.micro_batch(first_step_ + sequence / accumulation_, sequence % accumulation_);
  if (options_.pin_memory)
    for (auto& [key, tensor] : batch) tensor = tensor.pin_memory();
  return batch;
}

void DataLoader::work() {
  // No c10::ParallelGuard here to keep the workers serial: it is process-wide, and ATen kernels on
  // the training thread pick other code paths under it (the loss of a test run changed).
  while (true) {
    int64_t sequence = 0;
    {
      std::unique_lock<std::mutex> lock(queue_->mutex);
      queue_->work_ready.wait(lock, [&] { return queue_->stopping || !queue_->pending.empty(); });
      if (queue_->stopping) return;
      sequence = queue_->pending.front();
      queue_->pending.pop_front();
    }
    Queue::Result result;
    try {
      result.batch = load(sequence);
    } catch (...) {
      result.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(queue_->mutex);
      queue_->results[sequence] = std::move(result);
    }
    queue_->result_ready.notify_all();
  }
}

void DataLoader::submit_ahead() {
  if (workers_.empty()) return;
  const int64_t depth = static_cast<int64_t>(options_.num_workers) * options_.prefetch_factor;
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    for (; submitted_ < total_ && submitted_ < consumed_ + depth; ++submitted_) queue_->pending.push_back(submitted_);
  }
  queue_->work_ready.notify_all();
}

Batch DataLoader::next(int64_t step, int64_t micro) {
  const int64_t sequence = consumed_;
  if (sequence >= total_ || first_step_ + sequence / accumulation_ != step || sequence % accumulation_ != micro)
    fail("data loader: asked for step ", step, " micro-batch ", micro, ", but the next one is step ",
         first_step_ + sequence / accumulation_, " micro-batch ", sequence % accumulation_,
         sequence >= total_ ? " (past the last step)" : "");
  ++consumed_;
  if (workers_.empty()) return load(sequence);
  submit_ahead();
  Queue::Result result;
  {
    std::unique_lock<std::mutex> lock(queue_->mutex);
    queue_->result_ready.wait(lock, [&] { return queue_->results.count(sequence) > 0; });
    result = std::move(queue_->results[sequence]);
    queue_->results.erase(sequence);
  }
  if (result.error) std::rethrow_exception(result.error);
  return std::move(result.batch);
}

}  // namespace mmtrain
