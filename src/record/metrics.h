// Per-iteration metrics: one JSON record per optimizer step to metrics.jsonl (rank 0), the same
// scalars to TensorBoard with logging.tensorboard, and a Megatron-style line to the console, which
// log parsers key on:
//   iteration N/M | consumed samples: C | elapsed time per iteration (ms): T | learning rate: L |
//   global batch size: G | loss: X | grad norm: Y | TFLOP/s per device: F | MFU: U %
#pragma once
#include "record/eval_record.h"
#include "record/sample_record.h"
#include "record/logging_config.h"
#include "record/step_record.h"
#include "record/tensorboard.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>

namespace mmtrain {

class MetricsLog {
 public:
  // Opens <output_dir>/metrics.jsonl for appending (rank 0 only writes). The trainer has made sure
  // it holds nothing (a fresh run) or only iterations before this run's first (a resumed one).
  // tensorboard: also write each record as TensorBoard scalars under <output_dir>/tensorboard/.
  MetricsLog(const std::string& output_dir, bool is_writer, bool progress, bool tensorboard = false);
  ~MetricsLog();
  void record(const StepRecord& step, int64_t train_iters);
  // An evaluation: its line in metrics.jsonl, eval/... TensorBoard scalars, a console line.
  void record(const EvalRecord& eval);
  // A sampling phase: its line in metrics.jsonl, its images, audio and texts in TensorBoard.
  void record(const SampleRecord& samples);

 private:
  std::FILE* file_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  bool is_writer_ = false;
  bool progress_ = false;  // stdout is a terminal: add an ETA
  double elapsed_ms_ = 0;
  int64_t recorded_ = 0;
};

// What <output_dir>/metrics.jsonl already holds: an earlier run's iterations.
struct MetricsOnDisk {
  std::string path;
  int64_t records = 0;
  int64_t first_iteration = 0, last_iteration = 0;
};
MetricsOnDisk metrics_on_disk(const std::string& output_dir);
// A resumed run continues after `iteration`: the records past it (an interrupted run's last
// steps, which are trained again) are dropped from metrics.jsonl, by an atomic rewrite, so that
// the file holds one curve. Returns how many records were dropped.
int64_t metrics_keep_through(const std::string& output_dir, int64_t iteration);

// Peak resident set size of this process in MiB (VmHWM).
double peak_rss_mb();
// This process's resident set now (VmRSS), in MB.
double current_rss_mb();

}  // namespace mmtrain
