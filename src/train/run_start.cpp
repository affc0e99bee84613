#include "train/run_start.h"

#include "checkpoint/sharded_checkpoint.h"
#include "config/registries.h"
#include "core/error.h"
#include "core/text.h"
#include "dist/node_names.h"
#include "fsdp/shard_pager.h"
#include "plan/preflight.h"
#include "record/metrics.h"
#include "train/build.h"
#include "train/objective.h"
#include "train/state.h"

#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

namespace mmtrain {

namespace {

// training.load, with auto resolved: training.save when it holds a complete checkpoint (its
// `latest`), else "" (a fresh start). torchrun --max-restarts relaunches then resume by themselves.
std::string resolve_load(const Run& run) {
  const auto& t = run.config.training;
  if (t.load != "auto") return t.load;
  if (checkpoint_saved_under(t.save)) {
    run.log("training.load: auto: resuming from the newest checkpoint under " + t.save);
    return t.save;
  }
  run.log("training.load: auto: no checkpoint under " + t.save + " yet: starting fresh");
  return {};
}

// A fresh run into an output_dir that holds another run's metrics would interleave two curves
// in one metrics.jsonl: every rank stops, rank 0 saying why.
void refuse_an_earlier_run(const Run& run) {
  const auto& dir = run.config.logging.output_dir;
  const auto earlier = run.is_rank0() ? metrics_on_disk(dir) : MetricsOnDisk{};
  if (!run.comm().any_rank(earlier.records > 0)) return;
  if (!run.is_rank0()) fail("rank 0 refused the run (logging.output_dir holds an earlier run): see its error");
  fail("config ", run.config.source_path, ": logging.output_dir '", dir, "' already holds a run (", earlier.path, ": ",
       earlier.records, " records, iterations ", earlier.first_iteration, "-", earlier.last_iteration,
       "); a new run there would mix two runs in one file: choose another output_dir, remove the old one, or "
       "resume it (training.load: auto with training.save, or a checkpoint path)");
}

// A resumed checkpoint at or past train_iters leaves nothing to train. Under training.load:
// auto that is a finished run started again (a requeued job): say so and exit 0. A checkpoint
// named explicitly was meant to be trained on: an error, naming both numbers.
void refuse_a_finished_run(const Run& run, const std::string& load) {
  const auto& t = run.config.training;
  if (run.start_step < t.train_iters) return;
  const std::string what = load + " is at iteration " + std::to_string(run.start_step) + " and training.train_iters is " +
                           std::to_string(t.train_iters);
  if (t.load != "auto")
    fail("config ", run.config.source_path, ": training.load ", what, ": nothing to train (raise training.train_iters ",
         "to train on from it)");
  run.log("training.load: auto: " + what + ": this run has finished, nothing to train");
}

// A resumed run trains again what came after its checkpoint: those records go.
void continue_metrics(const Run& run) {
  if (!run.is_rank0()) return;
  const int64_t dropped = metrics_keep_through(run.config.logging.output_dir, run.start_step);
  if (dropped > 0)
    run.log("metrics.jsonl: dropped " + std::to_string(dropped) + " records after iteration " +
            std::to_string(run.start_step) + " (the interrupted run's; they are trained again now)");
}

void load_weights(Run& run) {
  const std::string& path = run.config.model.weights_path();
  const int64_t conversions = load_initial_weights(run.config, *run.model, *run.fsdp);  // pages shards on disk unit by unit
  if (path.empty()) {
    run.log("no model weights given: random init with seed " + std::to_string(run.config.training.seed));
  } else {
    std::printf("[mmtrain] rank %d loaded %s (%lld tensors with a converted layout)\n", run.comm().rank(), path.c_str(),
                static_cast<long long>(conversions));
  }
  const std::string& base_quant = run.config.features.lora.base_quant;
  if (!run.config.features.enable_lora || base_quant == "none") return;
  // What the quantized base holds on this rank, against the same weights in their gather dtype.
  int64_t weights = 0, stored = 0, unquantized = 0;
  for (auto* unit : run.fsdp->units())
    for (const auto& p : unit->params)
      if (p.quant != quant::BaseQuant::none) {
        ++weights;
        stored += p.shard.numel();
        unquantized += p.layout.shard_numel() * static_cast<int64_t>(c10::elementSize(unit->gather_dtype));
      }
  run.log(format("features.lora.base_quant %s: %lld frozen weights as rows of codes and scales, %.2f MB on this rank "
                 "(%.2f MB in their gather dtype); adaptable frozen weights whose rows are not whole blocks stay in it",
                 base_quant.c_str(), static_cast<long long>(weights), stored / 1e6, unquantized / 1e6));
}

// A new lineage's name: 64 random bits from rank 0, the same on every rank.
std::string new_lineage(const Run& run) {
  std::random_device random;
  const double high = run.is_rank0() ? random() : 0, low = run.is_rank0() ? random() : 0;
  const auto shared = run.comm().all_reduce_sum(std::vector<double>{high, low});
  char text[32];
  std::snprintf(text, sizeof text, "%08x%08x", static_cast<unsigned>(shared[0]), static_cast<unsigned>(shared[1]));
  return text;
}

std::string utc_stamp() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%SZ", std::gmtime(&now));
  return text;
}

// training.keep_best's list as the checkpoints on disk have it (a run killed while pruning, or a
// list from before only saved checkpoints entered it), and best.json rewritten to match. After
// claim_save_root: the save root is this run's.
void rebuild_best_index(Run& run) {
  const auto& t = run.config.training;
  if (t.save.empty()) return;
  run.best = best_checkpoints_on_disk(t.save, run.best);
  if (run.is_rank0() && t.keep_best > 0) {
    best_checkpoints_remove_stale_temps(t.save);
    best_checkpoints_write_index(t.save, run.best);
  }
}

// A run starting at start_step saves its own line of checkpoints into training.save: complete
// checkpoints there of a later iteration belong to another branch (a rollback, another run), and
// this run's saves would interleave with them, be pruned for them or replace one of them. Refused
// naming them, or, with training.archive_newer_checkpoints, moved aside (never deleted). Under
// training.load: auto the run continues from `latest`, its root's last commit: a complete
// checkpoint newer than that is a save killed between its rename and `latest` (or a hand-edited
// `latest`), moved aside without asking, so that a requeued job restarts by itself.
void claim_save_root(Run& run) {
  const auto& t = run.config.training;
  if (t.save.empty()) return;
  std::string refused;
  if (run.is_rank0()) {
    const auto newer = checkpoint_newer_than(t.save, run.start_step);
    const bool uncommitted = t.load == "auto";
    if (!newer.empty() && (uncommitted || t.archive_newer_checkpoints)) {
      const std::string archive = "archived_" + utc_stamp() + (uncommitted ? "_uncommitted_after_" : "_branch_at_") +
                                  checkpoint_dir_name(run.start_step);
      const std::string dir = checkpoint_archive(t.save, newer, archive);
      run.log(uncommitted ? "training.load: auto: " + join(newer, ", ") + " newer than `latest` (a save that never "
                                "named them, interrupted before its last step) moved to " + dir +
                                "; continuing from iteration " + std::to_string(run.start_step)
                          : "training.archive_newer_checkpoints: moved " + join(newer, ", ") + " (newer than iteration " +
                                std::to_string(run.start_step) + ", another branch) to " + dir);
    } else if (!newer.empty()) {
      refused = "config " + run.config.source_path + ": training.save '" + t.save + "' holds checkpoints newer than " +
                "this run's start at iteration " + std::to_string(run.start_step) + ": " + join(newer, ", ") +
                "; they are another branch, which this run's saves would mix with, prune for, or replace. Resume "
                "the newest (training.load: auto), choose another training.save, or set "
                "training.archive_newer_checkpoints: true to move them aside (never deleted)";
    }
  }
  if (run.comm().any_rank(!refused.empty())) {
    if (!run.is_rank0()) fail("rank 0 refused training.save '", t.save, "': see its error");
    fail(refused);
  }
}

// After an elastic restart: which nodes the run lost or gained since its checkpoint.
void report_node_changes(const Run& run, const std::vector<std::string>& saved_nodes) {
  const auto nodes = node_names_of_ranks(run.runtime.store, run.comm().rank(), run.comm().world_size());
  if (saved_nodes.empty() || saved_nodes == nodes) return;
  std::string line = "the nodes changed since the checkpoint: it was saved on " + describe_nodes(saved_nodes) +
                     "; this run has " + describe_nodes(nodes);
  if (const auto lost = nodes_missing(saved_nodes, nodes); !lost.empty()) line += "; lost: " + join(lost, ", ");
  if (const auto joined = nodes_missing(nodes, saved_nodes); !joined.empty()) line += "; joined: " + join(joined, ", ");
  run.log(line + "; global batch " + std::to_string(run.data.sampler.global_batch_size()) +
          " kept with gradient accumulation " + std::to_string(run.config.training.gradient_accumulation_steps));
}

// training.ema over the FSDP units' trained shards, its shadows copies of them now: beside them,
// or in the tier training.ema.offload names. Shards on disk come in a unit at a time for it.
std::unique_ptr<Ema> make_ema(Run& run) {
  const EmaConfig& config = run.config.training.ema;
  const auto units = run.fsdp->units();
  std::vector<at::Tensor> shards;
  int64_t largest = 0, total = 0;
  for (auto* unit : units) {
    shards.push_back(unit->shard_flat);
    largest = std::max(largest, unit->shard_flat.numel());
    total += unit->shard_flat.numel();
  }
  Ema::Residency residency;
  if (ShardPager* pager = run.fsdp->shard_pager()) {
    residency.before = [pager, units](size_t u) { pager->page_in_reading_next(*units[u]); };
    residency.after = [pager, units](size_t u, bool changed) { pager->page_out(*units[u], changed); };
  }
  if (config.offload == "none") return std::make_unique<Ema>(config, std::move(shards), nullptr, 0, residency);
  auto store = run.swap_store(/*on_disk=*/config.offload == "disk");
  auto ema = std::make_unique<Ema>(config, std::move(shards), store,
                                   offload_chunk_numel(run.config.training, run.runtime.device, largest, 1), residency);
  run.log(format("EMA shadows %s (%.1f MiB per rank), through %.1f MiB of windows", store->describe().c_str(),
                 total * 4 / 1048576.0, ema->state_bytes() / 1048576.0));
  return ema;
}

void resume(Run& run, const std::string& path) {
  StateLoadOptions options;
  options.model_id = run.config.model.model_id;
  options.global_batch_size = run.data.sampler.global_batch_size();
  options.load_optimizer = !run.config.training.no_load_optim;
  options.load_rng = !run.config.training.no_load_rng;
  options.model_config = run.config.model.config;
  options.execution_only_keys = config_model_spec(run.config).execution_only_keys;
  options.lora_base = run.lora_base;
  options.preference_reference = run.preference_reference_identity;
  if (run.config.training.ema.enable) {
    run.ema = make_ema(run);  // its shadows come from the checkpoint
    options.ema = run.ema.get();
  }
  const StateLoaded loaded = state_load(path, run.comm(), *run.model, *run.fsdp, *run.optimizer, options);  // a unit at a time
  if (loaded.model_only) {
    run.ema.reset();  // a fresh run: the EMA starts at these weights (start_run)
    run.log("initialized from model-only checkpoint " + loaded.dir);
    return;
  }
  if (const auto why = held_out_draw_difference(loaded.held_out, held_out_draw(run.config, *run.data.dataset)); !why.empty())
    fail("cannot resume from ", loaded.dir, ": ", why);
  run.start_step = loaded.iteration;
  run.lineage = loaded.lineage;
  run.best = loaded.best;
  run.log("resumed from " + loaded.dir + " at iteration " + std::to_string(run.start_step) + " (saved on " +
          std::to_string(loaded.saved_world_size) + " ranks, now " + std::to_string(run.comm().world_size()) + ")");
  report_node_changes(run, loaded.saved_nodes);
}

}  // namespace

std::unique_ptr<Run> start_run(Config config, Runtime runtime) {
  auto run = std::make_unique<Run>();
  run->config = std::move(config);
  run->runtime = std::move(runtime);
  Run& r = *run;
  check_objective(r.config);
  const std::string load = resolve_load(r);
  if (load.empty()) refuse_an_earlier_run(r);  // before anything big is allocated
  build_run(r);
  r.lineage = new_lineage(r);  // a resume continues the loaded checkpoint's instead
  r.lora_base = lora_base(r.config, &r.comm());
  r.preference_reference_identity = preference_reference_identity(r.config, &r.comm());
  const bool lora = !r.lora_base.is_null();
  if (lora) load_weights(r);  // a LoRA checkpoint holds the adapters; the base comes from the model weights
  if (!load.empty()) {
    resume(r, load);
    if (r.start_step == 0) refuse_an_earlier_run(r);  // a model-only checkpoint starts a fresh run
    refuse_a_finished_run(r, load);
  }
  claim_save_root(r);
  if (!load.empty()) {
    rebuild_best_index(r);
    continue_metrics(r);
  } else if (!lora) {
    load_weights(r);
  }
  if (r.config.training.ema.enable && !r.ema) r.ema = make_ema(r);  // a fresh run: from its initial weights
  return run;
}

}  // namespace mmtrain
