#include "record/profiler.h"

#include "core/error.h"
#include "io/user_file.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <set>

namespace mmtrain {
namespace {

using torch::profiler::impl::ActivityType;

std::set<ActivityType> activities(bool cuda) {
  std::set<ActivityType> out = {ActivityType::CPU};
  if (cuda) out.insert(ActivityType::CUDA);
  return out;
}

torch::profiler::impl::ProfilerConfig kineto_config(const ProfileConfig& c) {
  return torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::KINETO, c.record_shapes,
                                               c.with_memory, /*with_stack=*/false, /*with_flops=*/false,
                                               /*with_modules=*/false);
}

}  // namespace

StepProfiler::StepProfiler(const ProfileConfig& config, int rank, std::string save_dir, bool cuda)
    : config_(config), rank_(rank), save_dir_(std::move(save_dir)), cuda_(cuda) {
  const auto& ranks = config_.ranks;
  this_rank_ = config_.enable && (std::find(ranks.begin(), ranks.end(), -1) != ranks.end() ||
                                  std::find(ranks.begin(), ranks.end(), rank) != ranks.end());
  if (!this_rank_) return;
  std::error_code error;
  std::filesystem::create_directories(save_dir_, error);
  if (error) fail("tools.profile.save_path '", save_dir_, "': cannot create it: ", error.message());
  // Warm the profiler up front so that the first traced step does not pay Kineto's start-up.
  torch::autograd::profiler::prepareProfiler(kineto_config(config_), activities(cuda_));
}

StepProfiler::~StepProfiler() {
  // A run that stops early (exit_interval, an error) still writes what it traced.
  if (active_) {
    try {
      stop_and_save();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mmtrain: tools.profile: could not save the trace: %s\n", e.what());
    }
  }
}

std::string StepProfiler::trace_path() const {
  if (!this_rank_) return {};
  return (std::filesystem::path(save_dir_) / ("rank" + std::to_string(rank_) + ".pt.trace.json")).string();
}

void StepProfiler::begin_step(int64_t iteration) {
  if (!this_rank_ || iteration < config_.start_step || iteration > config_.end_step) return;
  if (!active_) {
    torch::autograd::profiler::enableProfiler(kineto_config(config_), activities(cuda_));
    active_ = true;
  }
  step_scope_.emplace(at::RecordScope::USER_SCOPE);
  if (step_scope_->isActive()) step_scope_->before("ProfilerStep#" + std::to_string(iteration));
}

void StepProfiler::end_step(int64_t iteration) {
  if (!active_) return;
  step_scope_.reset();  // ends the step's scope
  if (iteration >= config_.end_step) stop_and_save();
}

void StepProfiler::stop_and_save() {
  step_scope_.reset();
  active_ = false;
  auto result = torch::autograd::profiler::disableProfiler();
  // Kineto writes the trace by name: into a file of its own, created new here (never through a
  // link), then renamed over the trace's path (a rename replaces a link, never writes through it).
  const auto path = trace_path();
  const auto tmp = path + ".tmp-" + std::to_string(::getpid());
  ::unlink(tmp.c_str());
  const int fd = create_new_file(tmp);
  if (fd < 0) fail("tools.profile: cannot create ", tmp, ": ", std::strerror(errno));
  ::close(fd);
  result->save(tmp);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    fail("tools.profile: cannot write ", path, ": ", std::strerror(err));
  }
  std::printf("[mmtrain] rank %d wrote profiler trace %s (iterations %lld-%lld; open it in ui.perfetto.dev)\n",
              rank_, path.c_str(), static_cast<long long>(config_.start_step),
              static_cast<long long>(config_.end_step));
  std::fflush(stdout);
}

}  // namespace mmtrain
