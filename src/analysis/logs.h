// Training logs (`mmtrain logs parse | summary | compare | plot`): the numbers the seeds
// report for a run (steady-state median / mean / P95 step time, last-W averages, loss agreement
// between two runs). Reads either format, line by line, mixed freely:
//   mmtrain metrics.jsonl    {"iteration": 3, "loss": ..., "step_time_ms": ..., ...}
//   Megatron / MindSpeed / mmtrain console lines (record/metrics.cpp):
//     [time] iteration N/M | consumed samples: C | elapsed time per iteration (ms): T |
//     learning rate: L | global batch size: G | loss: X | grad norm: Y [| TFLOP/s per device: F]
//     [| MFU: U %] [| other key: value ...]
// Every other line is ignored. Records are normalized to one JSON object per iteration with
// iteration, train_iters, consumed_samples, step_time_ms, lr, global_batch_size, loss, grad_norm,
// tflops_per_device, mfu (a fraction), tokens when present, and any other numeric field under a
// snake_case key ("lm loss" -> lm_loss, "number of skipped iterations" -> ...). When an iteration
// appears twice (a resumed run appending to its log) the later record wins.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace mmtrain {

using LogRecord = nlohmann::ordered_json;

// One console line; nullopt when it is not an iteration line.
std::optional<LogRecord> parse_log_line(const std::string& line);
// Every iteration record of a log, sorted by iteration, duplicates resolved (later wins).
// source names the input in error messages (a malformed JSON line is an error).
std::vector<LogRecord> parse_training_log(std::istream& in, const std::string& source);
std::vector<LogRecord> parse_training_log_file(const std::string& path);
// Evaluation records (record/eval_record.h, "kind": "eval") are not iteration records: the parse
// above skips them; these read them, by iteration (later wins).
bool is_eval_record(const LogRecord& record);
std::vector<LogRecord> parse_eval_records_file(const std::string& path);
// {"evaluations", "last_eval_loss", "last_eval_iteration", "best_eval_loss", "best_eval_iteration"}:
// the best is the lowest finite eval_loss.
LogRecord eval_summary(const std::vector<LogRecord>& evals);

struct LogStatsOptions {
  int64_t skip_first = 1;  // warm-up iterations left out of step-time statistics (seed: the first)
  int64_t window = 0;      // > 0: also averages over the last `window` iterations (seed: 500)
};

// One run: iterations, steady-state step time (median, mean, P95 after skip_first), throughput
// (samples/s from global_batch_size, tokens/s, TFLOP/s per device and MFU medians when logged),
// mean loss, last loss and grad norm, and the last-window averages.
LogRecord log_summary(const std::vector<LogRecord>& records, const LogStatsOptions& options);

// Two runs: loss over the iterations both have (relative difference Σ|a-b| / Σ|b|, max |a-b| and
// where), each run's summary, and the step-time ratio a/b of the medians.
LogRecord compare_training_logs(const std::vector<LogRecord>& a, const std::vector<LogRecord>& b,
                                const LogStatsOptions& options);

// The CLI's `logs parse|summary|compare|plot` (add_logs_commands): parse prints one JSON line per
// iteration; summary and compare print a human summary, then their result as the last JSON line;
// plot and compare --plot draw figures (analysis/plots.h).

}  // namespace mmtrain
