#include "checkpoint/async_checkpoint.h"

#include "core/error.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <exception>
#include <filesystem>

namespace mmtrain {
namespace {

bool finished(const std::future<void>& job) {
  return job.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
}

// A rank's outcome of a background job, as the double it travels in (an all-reduce of doubles).
constexpr double kRunning = 0, kDone = 1, kFailed = 2;

// The calling (background) thread gets the lowest CPU priority (nice 19): where every core
// trains, the save takes only what training leaves.
void yield_to_training() { ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19); }

}  // namespace

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  if (write_.valid()) write_.wait();
  if (commit_.valid()) commit_.wait();
}

AsyncCheckpointSaver::Staged AsyncCheckpointSaver::start(const std::string& save_root, int64_t iteration,
                                                         const std::vector<ShardedTensor>& tensors,
                                                         nlohmann::json global_state, nlohmann::json rank_state,
                                                         nlohmann::json plan, int keep_latest_k,
                                                         StagedCheck check_staged) {
  if (in_flight())
    fail("async checkpoint of iteration ", iteration, ": ", name_, " is still in flight (wait() for it first)");
  const int rank = comm_.rank(), world = comm_.world_size();
  const std::string name = checkpoint_dir_name(iteration);

  // Step 1, and every rank learns its outcome before anyone writes.
  std::string prepare_error;
  if (rank == 0) {
    try {
      checkpoint_save_prepare(save_root, iteration);
    } catch (const std::exception& e) {
      prepare_error = e.what();
    }
  }
  if (comm_.any_rank(!prepare_error.empty())) {
    if (rank == 0) fail(prepare_error);
    fail("checkpoint_save rank ", rank, ": rank 0 could not create ", name, ".tmp under ", save_root,
         " (rank 0's error says why)");
  }

  // The staging copy: from here on training may change the live tensors.
  const auto began = std::chrono::steady_clock::now();
  Staged staged;
  if (staging_.size() != tensors.size()) staging_.assign(tensors.size(), at::Tensor());
  std::vector<ShardedTensor> staged_tensors = tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor live = tensors[i].local.defined() ? tensors[i].local
                            : tensors[i].fetch         ? tensors[i].fetch()
                                                       : at::Tensor();
    if (!live.defined()) continue;  // checkpoint_save_rank_file names it
    at::Tensor& buffer = staging_[i];
    if (!buffer.defined() || buffer.sizes() != live.sizes() || buffer.scalar_type() != live.scalar_type())
      buffer = at::empty(live.sizes(), live.options().device(at::kCPU).pinned_memory(live.is_cuda()));
    buffer.copy_(live);
    staged_tensors[i].local = buffer;
    staged_tensors[i].fetch = nullptr;
    staged.bytes += static_cast<int64_t>(buffer.nbytes());
  }
  staged.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();

  save_root_ = save_root;
  name_ = name;
  iteration_ = iteration;
  global_state_ = std::move(global_state);
  plan_ = std::move(plan);
  keep_latest_k_ = keep_latest_k;
  write_ = std::async(std::launch::async, [=, tensors = std::move(staged_tensors), rank_state = std::move(rank_state),
                                            check_staged = std::move(check_staged)] {
                        yield_to_training();
                        if (check_staged) check_staged(tensors);
                        checkpoint_save_rank_file(save_root, iteration, rank, world, tensors, rank_state);
                      });
  phase_ = Phase::writing;
  return staged;
}

std::vector<double> AsyncCheckpointSaver::agree(std::future<void>* job, bool block, const char* what) {
  const int rank = comm_.rank();
  // A rank without a job in this phase, or whose job finished at an earlier poll (its future
  // then holds nothing), has nothing to wait for.
  double mine = kDone;
  if (job && job->valid()) {
    if (block) job->wait();
    if (!finished(*job)) {
      mine = kRunning;
    } else {
      try {
        job->get();
      } catch (const std::exception& e) {
        job_error_ = e.what();
        mine = kFailed;
      }
    }
  }
  std::vector<double> outcomes(comm_.world_size(), 0.0);
  outcomes[rank] = mine;
  outcomes = comm_.all_reduce_sum(outcomes);
  std::string failed_ranks;
  for (size_t r = 0; r < outcomes.size(); ++r)
    if (outcomes[r] == kFailed) failed_ranks += (failed_ranks.empty() ? "" : ", ") + std::to_string(r);
  if (!failed_ranks.empty()) {
    phase_ = Phase::idle;  // nothing of this save is committed; the next save clears its tmp dir
    const std::string consequence = "; training stops, and `latest` under " + save_root_ +
                                    " still names the previous complete checkpoint";
    if (mine == kFailed) fail("checkpoint ", name_, ": the background ", what, " failed: ", job_error_, consequence);
    fail("checkpoint ", name_, ": the background ", what, " failed on rank ", failed_ranks,
         " (that rank's error says why)", consequence);
  }
  return outcomes;
}

std::optional<AsyncCheckpointSaver::Completed> AsyncCheckpointSaver::advance(bool block) {
  if (phase_ == Phase::idle) return std::nullopt;
  const bool rank0 = comm_.rank() == 0;
  if (phase_ == Phase::writing) {
    const auto outcomes = agree(&write_, block, "write of the rank files");
    for (double outcome : outcomes)
      if (outcome == kRunning) return std::nullopt;
    if (rank0) {
      commit_ = std::async(std::launch::async, [this, world = comm_.world_size()] {
        yield_to_training();
        checkpoint_save_commit(save_root_, iteration_, world, global_state_, plan_);
        // Never throws: the commit stands whatever pruning meets.
        pruned_ = keep_latest_k_ > 0 ? checkpoint_prune(save_root_, keep_latest_k_, global_state_.value("lineage", ""))
                                     : CheckpointPruned{};
      });
    }
    phase_ = Phase::committing;
  }
  const auto outcomes = agree(rank0 ? &commit_ : nullptr, block, "commit");
  if (outcomes[0] == kRunning) return std::nullopt;
  phase_ = Phase::idle;
  Completed completed;
  completed.dir = (std::filesystem::path(save_root_) / name_).string();
  if (rank0) completed.pruned = pruned_;
  return completed;
}

}  // namespace mmtrain
