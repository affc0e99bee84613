#include "train/state.h"

#include "train/lora_base.h"
#include "train/preference_reference.h"
#include "train/state_adamw8bit.h"
#include "train/state_finite.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/text.h"
#include "dist/node_names.h"
#include "fsdp/shard_pager.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <set>

namespace mmtrain {
namespace {

const std::string kExpAvg = "optim.exp_avg.", kExpAvgSq = "optim.exp_avg_sq.", kEma = "ema.";

std::string to_hex(const at::Tensor& bytes) {
  static const char* digits = "0123456789abcdef";
  auto b = bytes.contiguous();
  const auto* data = b.data_ptr<uint8_t>();
  std::string out;
  for (int64_t i = 0; i < b.numel(); ++i) {
    out += digits[data[i] >> 4];
    out += digits[data[i] & 15];
  }
  return out;
}

// The bytes of a lowercase hex string (to_hex's output); where names the file and key.
at::Tensor from_hex(const std::string& hex, const std::string& where) {
  if (hex.size() % 2 != 0) fail(where, ": expected an even number of hex digits, found ", hex.size());
  auto out = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* data = out.data_ptr<uint8_t>();
  auto value = [&](size_t i) {
    const char c = hex[i];
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    fail(where, ": expected hex digits 0-9a-f, found '", std::string(1, c), "' at position ", i);
  };
  for (size_t i = 0; i + 1 < hex.size(); i += 2) data[i / 2] = static_cast<uint8_t>(value(i) * 16 + value(i + 1));
  return out;
}

}  // namespace

void state_restore_rng(const CheckpointReader& reader, int rank) {
  const auto rank_state = reader.rank_state(rank);
  const std::string where = "checkpoint " + reader.rank_file(rank) + ": rank_state.cpu_rng_state";
  if (!rank_state.is_object() || !rank_state.contains("cpu_rng_state"))
    fail(where, ": missing (the rank's RNG stream; resume with training.no_load_rng: true to start a fresh one)");
  const auto& value = rank_state["cpu_rng_state"];
  if (!value.is_string()) fail(where, ": expected a hex string, found ", value.dump());
  at::Generator generator = at::detail::getDefaultCPUGenerator();
  const auto state = from_hex(value.get<std::string>(), where);
  const int64_t expected = generator.get_state().numel();
  if (state.numel() != expected)
    fail(where, ": expected ", expected, " bytes (", 2 * expected, " hex digits), found ", state.numel());
  try {
    generator.set_state(state);
  } catch (const c10::Error& e) {
    fail(where, ": not a CPU generator state (", e.what_without_backtrace(), ")");
  }
}

namespace {

// A checkpoint is never written from a diverged state (train/state_finite.h asks for every
// trained tensor: weights and moments; buffers may hold -inf by design).
constexpr const char* kRefusal = "; refusing to save non-finite state (`latest` keeps naming the previous checkpoint)";

// A save's reach into this rank's trained state, a tensor at a time. The save asks for the tensors
// in unit order (twice: checksums, then bytes). A unit's shard on disk is paged in while its
// tensors are asked for (and the next unit's read ahead), the one before paged out; moments are
// read from their store one tensor's rows at a time, into host memory, never a device window. So
// a save holds at most one tensor's moments beyond the step, whatever the tiers (shards on disk
// page through the two buffers the step holds for them). Where the state is in memory anyway the
// tensors are the live ones (no copy). With check_finite, each tensor is checked for NaN/Inf the
// first time it is asked for (the checksum pass): the offending rank's save fails naming it before
// its file is written.
class UnitWindow {
 public:
  enum class Part { weight, exp_avg, exp_avg_sq, ema };

  UnitWindow(Fsdp& fsdp, const AdamW* adamw, const Ema* ema, int64_t iteration, bool check_finite)
      : units_(fsdp.units()), pager_(fsdp.shard_pager()), adamw_(adamw), ema_(ema), rank_(fsdp.comm().rank()),
        iteration_(iteration), check_finite_(check_finite) {}
  ~UnitWindow() { leave(); }  // paging out an unchanged shard writes nothing: it cannot fail
  UnitWindow(const UnitWindow&) = delete;
  UnitWindow& operator=(const UnitWindow&) = delete;

  // This rank's rows of `part` of param p of unit u, named `name` (for the NaN/Inf check).
  at::Tensor rows(size_t u, size_t p, Part part, const std::string& name) {
    const FsdpParam& param = units_[u]->params[p];
    const int64_t rows = param.layout.rows(rank_);
    at::Tensor out;
    if (part == Part::weight) {
      enter(u);
      out = param.shard.narrow(0, 0, rows);
    } else {
      std::vector<int64_t> shape = param.shard.sizes().vec();
      shape[0] = rows;
      const int64_t numel = rows * (rows > 0 ? param.shard[0].numel() : 0);
      out = part == Part::ema ? ema_->shadow_range(u, param.offset, numel).view(shape)
                              : adamw_->moment_range(u, part == Part::exp_avg_sq, param.offset, numel).view(shape);
    }
    return checked(name, out);
  }

  // tensor, checked for NaN/Inf the first time `name` is asked for (with check_finite).
  at::Tensor checked(const std::string& name, const at::Tensor& tensor) {
    if (check_finite_ && checked_.insert(name).second) {
      if (const std::string bad = describe_non_finite({{name, {}, 0, tensor}}, 1, rank_); !bad.empty())
        fail("checkpoint of iteration ", iteration_, " not written: ", bad, kRefusal);
    }
    return tensor;
  }

 private:
  void enter(size_t u) {
    if (current_ == u) return;
    leave();
    if (pager_) pager_->page_in_reading_next(*units_[u]);  // the save asks for the next one next
    current_ = u;
  }
  void leave() {
    if (!current_) return;
    if (pager_) pager_->page_out(*units_[*current_], /*changed=*/false);
    current_.reset();
  }

  std::vector<FsdpUnit*> units_;
  ShardPager* pager_;
  const AdamW* adamw_;
  const Ema* ema_;
  int rank_;
  int64_t iteration_;
  bool check_finite_;
  std::set<std::string> checked_;  // tensors checked for NaN/Inf
  std::optional<size_t> current_;  // the unit whose shard is paged in for the save
};

// This rank's shards of the params (real rows; none on HSDP replicas but the first) and, with
// an optimizer, of its state, with ema of the EMA's shadows, each fetched through `window` when the
// save asks for it.
std::vector<ShardedTensor> trained_shards(Fsdp& fsdp, const Optimizer* optimizer, const Ema* ema,
                                          const std::shared_ptr<UnitWindow>& window, bool with_frozen) {
  const auto* adamw = dynamic_cast<const AdamW*>(optimizer);
  const auto* adamw8bit = dynamic_cast<const AdamW8bit*>(optimizer);
  std::vector<ShardedTensor> out;
  const int rank = fsdp.comm().rank();
  const auto units = fsdp.units();
  for (size_t u = 0; u < units.size() && fsdp.is_primary_replica(); ++u) {
    for (size_t p = 0; p < units[u]->params.size(); ++p) {
      const FsdpParam& param = units[u]->params[p];
      if (param.frozen && !with_frozen) continue;  // a LoRA base: its weights are the run's model weights
      const int64_t begin = param.layout.row_begin(rank);
      auto part = [&](const std::string& key, UnitWindow::Part which) {
        out.push_back({key, param.param->shape, begin, at::Tensor(), [window, u, p, which, key] {
                         return window->rows(u, p, which, key);
                       }});
      };
      part(state_model_key(param.name), UnitWindow::Part::weight);
      if (ema && !param.frozen) part(kEma + param.name, UnitWindow::Part::ema);
      if (param.frozen) continue;  // a frozen param has no optimizer state
      if (adamw8bit) {
        auto checked = [window](const std::string& key, const at::Tensor& t) { return window->checked(key, t); };
        for (auto& shard : adamw8bit_param_shards(*adamw8bit, u, param, rank, checked)) out.push_back(std::move(shard));
      }
      if (!adamw) continue;
      part(kExpAvg + param.name, UnitWindow::Part::exp_avg);
      part(kExpAvgSq + param.name, UnitWindow::Part::exp_avg_sq);
    }
  }
  return out;
}

// The buffers, whole, saved by world rank 0.
void append_buffers(Model& model, int world_rank, std::vector<ShardedTensor>& out) {
  if (world_rank != 0) return;
  for (auto& [name, param] : model.named_parameters())
    if (!param->trainable) out.push_back({state_model_key(name), param->shape, 0, param->value});
}

// Everything a checkpoint of iteration info.iteration holds, not yet written: this rank's shards
// (trained tensors first, fetched a unit at a time through a UnitWindow: views of the live
// state, so copy them before training goes on; then buffers), trainer_state.json, this rank's
// state.
struct StateSnapshot {
  std::vector<ShardedTensor> tensors;
  size_t trained_count = 0;  // tensors[0, trained_count): weights and moments, which must be finite
  nlohmann::json global_state, rank_state;
};

// A training checkpoint records the effective config: its model.config must be this run's, key by
// key, apart from the keys that only change how the model computes.
// what: "resume from" | "evaluate", as the errors say it.
void check_same_model_config(const CheckpointReader& reader, const StateLoadOptions& options, const std::string& what) {
  const auto& global = reader.global_state();
  if (!global.contains("config") || !global["config"].contains("model") || !global["config"]["model"].contains("config"))
    fail("cannot ", what, " ", reader.dir(), ": its trainer_state.json records no config.model.config to compare with");
  const auto& saved = global["config"]["model"]["config"];
  const auto& now = options.model_config;
  std::set<std::string> keys;
  for (const auto& [key, value] : saved.items()) keys.insert(key);
  for (const auto& [key, value] : now.items()) keys.insert(key);
  auto text = [](const nlohmann::json& map, const std::string& key) {
    return map.contains(key) ? map[key].dump() : std::string("not set (the model's default)");
  };
  for (const auto& key : keys) {
    if (std::find(options.execution_only_keys.begin(), options.execution_only_keys.end(), key) !=
        options.execution_only_keys.end())
      continue;
    if (saved.contains(key) && now.contains(key) && saved[key] == now[key]) continue;
    fail("cannot ", what, " ", reader.dir(), ": it trained a different model: model.config.", key, " was ",
         text(saved, key), ", this config has ", text(now, key),
         " (use the checkpoint's model config, or start a new run from its weights)");
  }
}

// Every tensor of the checkpoint must be one this run loads: a tensor the model lacks would be
// dropped silently (a layer and its AdamW state gone).
void check_no_extra_tensors(const CheckpointReader& reader, Model& model, bool with_optimizer, bool with_ema = false) {
  std::set<std::string> expected;
  for (auto& [name, param] : model.named_parameters()) {
    expected.insert(state_model_key(name));
    if (param->trainable) {
      expected.insert(kExpAvg + name);
      expected.insert(kExpAvgSq + name);
      for (int moment = 0; moment < 2; ++moment) {  // training.optimizer adamw8bit's
        expected.insert(adamw8bit_codes_key(name, moment));
        expected.insert(adamw8bit_absmax_key(name, moment));
      }
    }
  }
  for (const auto& name : reader.names()) {
    const bool optimizer_state = name.rfind("optim.", 0) == 0;
    if (expected.count(name) || (optimizer_state && !with_optimizer)) continue;
    if (with_ema && name.rfind(kEma, 0) == 0 && expected.count(state_model_key(name.substr(kEma.size())))) continue;
    fail("cannot resume from ", reader.dir(), ": it holds tensor '", name,
         "', which this model does not have (was it saved by a larger model?)");
  }
}

// This rank's rows of the checkpoint's `prefix + param` for every trained param of unit, laid out
// as the unit's trained flat shard (shard_flat): a per-element state of the shards (moments, EMA).
// Frozen params have none (a checkpoint from before frozen params had none may hold zeros).
at::Tensor read_trained_flat(const CheckpointReader& reader, const FsdpUnit& unit, const std::string& prefix, int rank) {
  const auto flat = at::zeros_like(unit.shard_flat);
  for (const auto& p : unit.params) {
    if (p.frozen) continue;
    const int64_t rows = p.layout.rows(rank), begin = p.layout.row_begin(rank);
    const auto key = prefix + p.name;
    if (!reader.contains(key)) fail("checkpoint ", reader.dir(), ": missing tensor '", key, "'");
    if (rows > 0) p.view_of(flat).narrow(0, 0, rows).copy_(reader.read_rows(key, begin, begin + rows));
  }
  return flat;
}

// The EMA's shadows (training.ema) from a checkpoint that holds them.
void load_ema(const CheckpointReader& reader, Fsdp& fsdp, Ema& ema, int rank) {
  const auto units = fsdp.units();
  for (size_t u = 0; u < units.size(); ++u) ema.set_shadow(u, read_trained_flat(reader, *units[u], kEma, rank));
}

// A checkpoint with EMA shadows continues only a run that keeps them, and the other way round.
void check_ema(const CheckpointReader& reader, const Ema* ema) {
  const bool saved = reader.global_state().contains("ema");
  if (saved && !ema)
    fail("cannot resume from ", reader.dir(), ": it holds EMA weights (training.ema), which this run would drop; set ",
         "training.ema.enable: true to continue them, or export them first (mmtrain convert MODEL ckpt-to-hf --ema)");
  if (!saved && ema)
    fail("cannot resume from ", reader.dir(), ": training.ema is on and the checkpoint holds no EMA weights (it was ",
         "trained without); turn training.ema off to continue it, or start a new run from its weights to average them");
}

// What a checkpoint's optimizer state is (trainer_state.json "optimizer_state"; absent: AdamW's,
// from before the 8-bit one), and what this run's is.
std::string optimizer_state_kind(const Optimizer& optimizer) {
  return dynamic_cast<const AdamW8bit*>(&optimizer) ? "adamw8bit" : "adamw";
}

void load_optimizer(const CheckpointReader& reader, Fsdp& fsdp, Optimizer& optimizer, int rank) {
  const auto& global = reader.global_state();
  const std::string saved = global.value("optimizer_state", std::string("adamw")), ours = optimizer_state_kind(optimizer);
  auto text = [](const std::string& kind) {
    return kind == "adamw8bit" ? std::string("8-bit AdamW moments (training.optimizer adamw8bit)")
                               : std::string("fp32 AdamW moments (training.optimizer adamw or adamw_swap)");
  };
  if (saved != ours)
    fail("cannot resume from ", reader.dir(), ": it holds ", text(saved), " and this run keeps ", text(ours),
         "; set training.optimizer to match, or resume its weights alone with training.no_load_optim: true");
  if (auto* adamw8bit = dynamic_cast<AdamW8bit*>(&optimizer)) {
    const auto saved_min = global.value("min_8bit_size", nlohmann::json());
    const int64_t min_8bit_size = adamw8bit->min_8bit_size();
    if (!saved_min.is_number_integer() || saved_min.get<int64_t>() != min_8bit_size)
      fail("cannot resume from ", reader.dir(), ": its 8-bit AdamW kept params below min_8bit_size ", saved_min.dump(),
           " in fp32 and this run's training.min_8bit_size is ", min_8bit_size, "; set it to the checkpoint's");
    return adamw8bit_load(reader, fsdp, *adamw8bit, rank);
  }
  auto& adamw = dynamic_cast<AdamW&>(optimizer);
  const auto units = fsdp.units();
  for (size_t u = 0; u < units.size(); ++u) {
    adamw.set_moments(u, read_trained_flat(reader, *units[u], kExpAvg, rank),
                      read_trained_flat(reader, *units[u], kExpAvgSq, rank));
  }
}

// trainer_state.json's fields, checked: a missing key, a wrong type or a value out of range is an
// error naming the file and the key (not nlohmann's "key not found").
std::string state_path(const CheckpointReader& reader) { return reader.dir() + "/trainer_state.json"; }

std::string state_string(const CheckpointReader& reader, const char* key) {
  const auto& g = reader.global_state();
  if (!g.is_object() || !g.contains(key) || !g[key].is_string())
    fail("checkpoint ", state_path(reader), ": '", key, "' must be a string, found ",
         g.is_object() && g.contains(key) ? g[key].dump() : std::string("nothing"));
  return g[key].get<std::string>();
}

int64_t state_int(const CheckpointReader& reader, const char* key, int64_t minimum, int64_t maximum) {
  const auto& g = reader.global_state();
  if (!g.is_object() || !g.contains(key) || !g[key].is_number_integer())
    fail("checkpoint ", state_path(reader), ": '", key, "' must be an integer, found ",
         g.is_object() && g.contains(key) ? g[key].dump() : std::string("nothing"));
  const int64_t value = g[key].get<int64_t>();
  if (value < minimum || value > maximum)
    fail("checkpoint ", state_path(reader), ": '", key, "' must be in [", minimum, ", ", maximum, "], found ", value);
  return value;
}

StateSnapshot state_snapshot(const Comm& comm, Model& model, Fsdp& fsdp, const Optimizer* optimizer,
                             const StateInfo& info, bool check_finite) {
  StateSnapshot snapshot;
  snapshot.global_state =
      state_global_state(info, optimizer ? std::optional<int64_t>(optimizer->step_count()) : std::nullopt);
  if (optimizer) {
    snapshot.global_state["optimizer_state"] = optimizer_state_kind(*optimizer);
    if (const auto* adamw8bit = dynamic_cast<const AdamW8bit*>(optimizer))
      snapshot.global_state["min_8bit_size"] = adamw8bit->min_8bit_size();
  }
  const auto* adamw = dynamic_cast<const AdamW*>(optimizer);
  snapshot.tensors = trained_shards(fsdp, optimizer, info.ema,
                                    std::make_shared<UnitWindow>(fsdp, adamw, info.ema, info.iteration, check_finite),
                                    /*with_frozen=*/info.lora_base.is_null());
  snapshot.trained_count = snapshot.tensors.size();
  append_buffers(model, comm.rank(), snapshot.tensors);
  snapshot.rank_state = state_rank_state();
  return snapshot;
}


}  // namespace

std::string state_model_key(const std::string& param_name) { return "model." + param_name; }
std::string state_exp_avg_key(const std::string& param_name) { return kExpAvg + param_name; }
std::string state_ema_key(const std::string& param_name) { return kEma + param_name; }
std::string state_exp_avg_sq_key(const std::string& param_name) { return kExpAvgSq + param_name; }

nlohmann::json state_global_state(const StateInfo& info, std::optional<int64_t> optimizer_step) {
  nlohmann::json global = {{"iteration", info.iteration}, {"model_id", info.model_id}, {"config", info.config}};
  if (optimizer_step) {
    global["consumed_samples"] = info.iteration * info.global_batch_size;
    global["global_batch_size"] = info.global_batch_size;
    global["optimizer_step"] = *optimizer_step;
  } else {
    global["model_only"] = true;
  }
  for (const auto& [key, value] : info.extra.items()) global[key] = value;
  if (!info.lora_base.is_null()) global["lora_base"] = info.lora_base;
  if (!info.preference_reference.is_null()) global["preference_reference"] = info.preference_reference;
  if (info.ema) {
    const EmaConfig& e = info.ema->config();
    global["ema"] = {{"decay", e.decay},
                     {"min_decay", e.min_decay},
                     {"update_after_step", e.update_after_step},
                     {"use_ema_warmup", e.use_ema_warmup},
                     {"inv_gamma", e.inv_gamma},
                     {"power", e.power},
                     {"update_every", e.update_every}};
  }
  return global;
}

nlohmann::json state_rank_state() {
  return {{"cpu_rng_state", to_hex(at::detail::getDefaultCPUGenerator().get_state())}, {"node", node_name()}};
}

nlohmann::json state_plan_entry(const FsdpConfig& plan) {
  return {{"apply_modules", plan.apply_modules},
          {"param_dtype", dtype_name(plan.param_dtype)},
          {"reduce_dtype", dtype_name(plan.reduce_dtype)},
          {"sharding", "dim0 torch.chunk"}};
}


std::string state_save(const std::string& save_root, Comm& comm, Model& model, Fsdp& fsdp, const Optimizer* optimizer,
                       const StateInfo& info, const std::function<void()>& before_commit) {
  // Each unit is checked as it comes in for its checksum, before this rank's file is written; a
  // rank that refuses fails the save on every rank (checkpoint_save), and `latest` stays.
  const auto snapshot = state_snapshot(comm, model, fsdp, optimizer, info, /*check_finite=*/true);
  return checkpoint_save(save_root, info.iteration, comm, snapshot.tensors, snapshot.global_state,
                         snapshot.rank_state, info.plan, before_commit);
}

AsyncCheckpointSaver::Staged state_save_async(AsyncCheckpointSaver& saver, const std::string& save_root, Comm& comm,
                                              Model& model, Fsdp& fsdp, const Optimizer& optimizer, const StateInfo& info,
                                              int keep_latest_k) {
  // The staged copy is checked off the training thread.
  auto snapshot = state_snapshot(comm, model, fsdp, &optimizer, info, /*check_finite=*/false);
  auto refuse_non_finite = [trained_count = snapshot.trained_count, rank = comm.rank(),
                            iteration = info.iteration](const std::vector<ShardedTensor>& staged) {
    if (const std::string bad = describe_non_finite(staged, trained_count, rank); !bad.empty())
      fail("checkpoint of iteration ", iteration, " not written: ", bad, kRefusal);
  };
  return saver.start(save_root, info.iteration, snapshot.tensors, std::move(snapshot.global_state),
                     std::move(snapshot.rank_state), info.plan, keep_latest_k, refuse_non_finite);
}

void state_load_model(const CheckpointReader& reader, Model& model, Fsdp& fsdp, bool frozen_from_base, bool from_ema) {
  // from_ema: a trained param's shadow where the checkpoint holds one (frozen params have none).
  auto key_of = [&](const std::string& name) {
    return from_ema && reader.contains(state_ema_key(name)) ? state_ema_key(name) : state_model_key(name);
  };
  for (auto& [name, param] : model.named_parameters()) {
    if (frozen_from_base && param->trainable && !param->requires_grad) continue;
    const auto key = state_model_key(name);
    if (!reader.contains(key)) fail("checkpoint ", reader.dir(), ": missing tensor '", key, "'");
    if (reader.global_shape(key) != param->shape)
      fail("checkpoint ", reader.dir(), ": '", key, "' has shape ", shape_str(reader.global_shape(key)),
           ", the model expects ", shape_str(param->shape));
    if (!param->trainable) param->value = reader.read_full(key).to(fsdp.device(), at::kFloat);
  }
  fsdp.load_params(
      [&](const std::string& name, int64_t b, int64_t e) { return reader.read_rows(key_of(name), b, e); },
      /*frozen_too=*/!frozen_from_base);
}

namespace {

// A LoRA checkpoint continues only a LoRA run over the same base with the same adapters; a full
// one only a full run.
void check_lora_base(const CheckpointReader& reader, const nlohmann::json& run_base, const std::string& what) {
  const auto& global = reader.global_state();
  const bool saved_lora = global.contains("lora_base");
  if (saved_lora && run_base.is_null())
    fail("cannot ", what, " ", reader.dir(), ": it is a LoRA checkpoint (adapters over ",
         lora_base_describe(global["lora_base"]), "), and this config has features.enable_lora off; set it, with the ",
         "checkpoint's features.lora, or merge the adapters first (mmtrain convert MODEL merge-lora)");
  if (!saved_lora && !run_base.is_null())
    fail("cannot ", what, " ", reader.dir(), ": it is a full fine-tuning checkpoint and this config trains LoRA "
         "adapters; to put adapters on its weights, start a new run from them (model.checkpoint_path: an HF export "
         "of it, mmtrain convert MODEL ckpt-to-hf) instead of resuming");
  if (!saved_lora) return;
  if (const auto why = lora_adapters_difference(lora_adapters_of_checkpoint(global), run_base.at("adapters")); !why.empty())
    fail("cannot ", what, " ", reader.dir(), ": ", why);
  if (const auto why = lora_base_difference(global["lora_base"], run_base); !why.empty())
    fail("cannot ", what, " ", reader.dir(), ": ", why);
}

}  // namespace

StateLoaded state_load(const std::string& path, Comm& comm, Model& model, Fsdp& fsdp, Optimizer& optimizer,
                       const StateLoadOptions& options) {
  CheckpointReader reader(path);
  const auto& global = reader.global_state();
  StateLoaded loaded;
  loaded.dir = reader.dir();
  loaded.saved_world_size = reader.saved_world_size();
  loaded.lineage = reader.global_state().value("lineage", "");
  loaded.held_out = global.value("held_out", nlohmann::json());
  if (loaded.held_out.is_null()) {  // a checkpoint from before the draw was recorded: what its config says of it
    const auto config = global.value("config", nlohmann::json::object());
    const auto data = config.is_object() ? config.value("data", nlohmann::json::object()) : nlohmann::json();
    const auto training = config.is_object() ? config.value("training", nlohmann::json::object()) : nlohmann::json();
    if (data.is_object() && data.value("validation_split", nlohmann::json(0.0)).is_number() &&
        data.value("validation_split", 0.0) > 0.0 && training.is_object())
      loaded.held_out = {{"validation_split", data["validation_split"]}, {"seed", training.value("seed", nlohmann::json())}};
  }
  loaded.best = best_checkpoints_of(global, reader.dir() + "/trainer_state.json");
  for (int r = 0; r < reader.saved_world_size(); ++r) {
    const auto state = reader.rank_state(r);
    if (!state.contains("node") || !state["node"].is_string()) {
      loaded.saved_nodes.clear();  // a checkpoint from before nodes were recorded
      break;
    }
    loaded.saved_nodes.push_back(state["node"].get<std::string>());
  }
  const std::string saved_model = state_string(reader, "model_id");
  if (saved_model != options.model_id)
    fail("cannot resume from ", reader.dir(), ": it holds model '", saved_model, "', the config builds '",
         options.model_id, "'");
  // A model-only checkpoint (`mmtrain convert ... hf-to-ckpt`) starts a fresh run from its weights.
  if (global.value("model_only", false)) {
    if (!options.lora_base.is_null())
      fail("cannot start LoRA from ", reader.dir(), ": it is a model-only checkpoint; name its weights as the base ",
           "instead (model.checkpoint_path: its HF export, mmtrain convert MODEL ckpt-to-hf)");
    if (!options.preference_reference.is_null())
      fail("cannot start a full fine-tuning dpo run from ", reader.dir(), ": it is a model-only checkpoint, and the ",
           "frozen reference is the model's initial weights (", lora_base_describe(options.preference_reference),
           "), not its; name its weights as the model instead (model.checkpoint_path: its HF export, mmtrain ",
           "convert MODEL ckpt-to-hf)");
    check_no_extra_tensors(reader, model, false);
    state_load_model(reader, model, fsdp);
    loaded.model_only = true;
    return loaded;
  }
  // The iteration must be the one index.json and the directory name were written for.
  const int64_t iteration = state_int(reader, "iteration", reader.iteration(), reader.iteration());
  const int64_t saved_gbs = state_int(reader, "global_batch_size", 1, int64_t{1} << 40);
  if (saved_gbs != options.global_batch_size)
    fail("cannot resume from ", reader.dir(), ": it was trained with global batch size ", saved_gbs, " (world size ",
         reader.saved_world_size(), "), this run has ", options.global_batch_size, " (world size ", comm.world_size(),
         "); set training.global_batch_size to it (the accumulation is then derived for this world) or choose "
         "micro_batch_size/gradient_accumulation_steps so they match");
  check_same_model_config(reader, options, "resume from");
  check_lora_base(reader, options.lora_base, "resume from");
  check_ema(reader, options.ema);
  if (const auto why = preference_reference_difference(global, options.preference_reference); !why.empty())
    fail("cannot resume from ", reader.dir(), ": ", why);
  check_no_extra_tensors(reader, model, options.load_optimizer, /*with_ema=*/options.ema != nullptr);
  state_load_model(reader, model, fsdp, /*frozen_from_base=*/!options.lora_base.is_null());
  if (options.ema) load_ema(reader, fsdp, *options.ema, fsdp.comm().rank());
  if (options.load_optimizer) {
    load_optimizer(reader, fsdp, optimizer, fsdp.comm().rank());
    optimizer.set_step_count(state_int(reader, "optimizer_step", 0, iteration));
  }
  // Each rank restores its own RNG stream; on another world size there is no stream to restore.
  if (options.load_rng && reader.saved_world_size() == comm.world_size()) {
    state_restore_rng(reader, comm.rank());
  }
  loaded.iteration = iteration;
  return loaded;
}

StateLoaded state_load_weights(const std::string& path, Model& model, Fsdp& fsdp, const StateLoadOptions& options) {
  CheckpointReader reader(path);
  const auto& global = reader.global_state();
  StateLoaded loaded;
  loaded.dir = reader.dir();
  loaded.saved_world_size = reader.saved_world_size();
  const std::string saved_model = state_string(reader, "model_id");
  if (saved_model != options.model_id)
    fail("cannot evaluate ", reader.dir(), ": it holds model '", saved_model, "', the config builds '",
         options.model_id, "'");
  loaded.model_only = global.value("model_only", false);
  if (!loaded.model_only) {
    loaded.iteration = state_int(reader, "iteration", reader.iteration(), reader.iteration());
    check_same_model_config(reader, options, "evaluate");
    check_lora_base(reader, options.lora_base, "evaluate");
  }
  if (options.weights_from_ema && !global.contains("ema"))
    fail("cannot load the EMA weights of ", reader.dir(), ": it holds none (it was trained without training.ema)");
  check_no_extra_tensors(reader, model, !loaded.model_only, /*with_ema=*/global.contains("ema"));
  state_load_model(reader, model, fsdp, /*frozen_from_base=*/!options.lora_base.is_null() && !loaded.model_only,
                   options.weights_from_ema);
  return loaded;
}

}  // namespace mmtrain
