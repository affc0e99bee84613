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
  std::vector<at::Generator> generators;
  for (int64_t position : sampler.positions(step, micro)) {
    samples.push_back(dataset->get(sampler.sample_at(position)));
    generators.push_back(collate_generator(seed, position));
  }
  return collator->collate(samples, generators);
}

struct DataLoader::Queue {
  std::mutex mutex;
  std::condition_variable work_ready;    // a micro-batch was queued, or stopping
  std::condition_variable result_ready;  // a micro-batch (or its error) is in `results`
  std::deque<std::pair<int64_t, MicroBatchId>> pending;  // (sequence number, id)
  struct Result {
    Batch batch;
    std::exception_ptr error;
  };
  std::map<int64_t, Result> results;
  bool stopping = false;
};

DataLoader::DataLoader(const DataPipeline& pipeline, int64_t first_step, int64_t end_step, LoaderOptions options)
    : pipeline_(pipeline),
      end_step_(std::max(first_step, end_step)),
      next_{first_step, 0},
      next_submitted_{first_step, 0},
      options_(options),
      queue_(std::make_unique<Queue>()) {
  if (options_.num_workers < 0 || options_.prefetch_factor < 1)
    fail("data loader: num_workers must be >= 0 and prefetch_factor >= 1, found ", options_.num_workers, " and ",
         options_.prefetch_factor);
  for (int w = 0; w < options_.num_workers; ++w) workers_.emplace_back([this] { work(); });
  try {
    submit_ahead();  // a token-budget split can refuse a sample here
  } catch (...) {
    stop();
    throw;
  }
}

DataLoader::~DataLoader() { stop(); }

void DataLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stopping = true;
  }
  queue_->work_ready.notify_all();
  for (auto& worker : workers_) worker.join();
  workers_.clear();
}

MicroBatchId DataLoader::after(MicroBatchId id) const {
  if (id.micro + 1 < pipeline_.sampler.micro_batches(id.step)) return {id.step, id.micro + 1};
  return {id.step + 1, 0};
}

Batch DataLoader::load(MicroBatchId id) const {
  auto batch = pipeline_.micro_batch(id.step, id.micro);
  if (options_.pin_memory)
    for (auto& [key, tensor] : batch) tensor = tensor.pin_memory();
  return batch;
}

void DataLoader::work() {
  // No c10::ParallelGuard here to keep the workers serial: it is process-wide, and ATen kernels on
  // the training thread pick other code paths under it (the loss of a test run changed).
  while (true) {
    std::pair<int64_t, MicroBatchId> job;
    {
      std::unique_lock<std::mutex> lock(queue_->mutex);
      queue_->work_ready.wait(lock, [&] { return queue_->stopping || !queue_->pending.empty(); });
      if (queue_->stopping) return;
      job = queue_->pending.front();
      queue_->pending.pop_front();
    }
    Queue::Result result;
    try {
      result.batch = load(job.second);
    } catch (...) {
      result.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(queue_->mutex);
      queue_->results[job.first] = std::move(result);
    }
    queue_->result_ready.notify_all();
  }
}

// Runs on the training thread only (the constructor and next()): the workers never read the
// submission cursor.
void DataLoader::submit_ahead() {
  if (workers_.empty()) return;
  const int64_t depth = static_cast<int64_t>(options_.num_workers) * options_.prefetch_factor;
  std::vector<std::pair<int64_t, MicroBatchId>> jobs;
  for (; next_submitted_.step < end_step_ && submitted_ < consumed_ + depth; ++submitted_) {
    jobs.emplace_back(submitted_, next_submitted_);
    next_submitted_ = after(next_submitted_);  // may read sample lengths: outside the lock
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    for (const auto& job : jobs) queue_->pending.push_back(job);
  }
  queue_->work_ready.notify_all();
}

Batch DataLoader::next(int64_t step, int64_t micro) {
  const MicroBatchId id = next_;
  if (id.step >= end_step_ || id.step != step || id.micro != micro)
    fail("data loader: asked for step ", step, " micro-batch ", micro, ", but the next one is step ", id.step,
         " micro-batch ", id.micro, id.step >= end_step_ ? " (past the last step)" : "");
  const int64_t sequence = consumed_++;
  next_ = after(id);
  if (workers_.empty()) return load(id);
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
