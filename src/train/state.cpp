#include "train/state.h"

#include "core/error.h"
#include "core/text.h"

#include <ATen/CPUGeneratorImpl.h>

namespace mmtrain {
namespace {

const std::string kExpAvg = "optim.exp_avg.", kExpAvgSq = "optim.exp_avg_sq.";

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

at::Tensor from_hex(const std::string& hex) {
  auto out = at::empty({static_cast<int64_t>(hex.size() / 2)}, at::kByte);
  auto* data = out.data_ptr<uint8_t>();
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i + 1 < hex.size(); i += 2) data[i / 2] = static_cast<uint8_t>(value(hex[i]) * 16 + value(hex[i + 1]));
  return out;
}

// Params (this rank's real rows; none on HSDP replicas but the first), buffers (whole, world
// rank 0) and, with adamw, the moments.
std::vector<ShardedTensor> sharded_tensors(Model& model, Fsdp& fsdp, const AdamW* adamw, int world_rank) {
  std::vector<ShardedTensor> out;
  const int rank = fsdp.comm().rank();
  const auto units = fsdp.units();
  for (size_t u = 0; u < units.size() && fsdp.is_primary_replica(); ++u)
    for (auto& p : units[u]->params) {
      const int64_t begin = p.layout.row_begin(rank), rows = p.layout.rows(rank);
      out.push_back({state_model_key(p.name), p.param->shape, begin, p.shard.narrow(0, 0, rows)});
      if (!adamw) continue;
      const auto& state = adamw->states()[u];
      out.push_back({kExpAvg + p.name, p.param->shape, begin, p.view_of(state.exp_avg).narrow(0, 0, rows)});
      out.push_back({kExpAvgSq + p.name, p.param->shape, begin, p.view_of(state.exp_avg_sq).narrow(0, 0, rows)});
    }
  if (world_rank == 0)
    for (auto& [name, param] : model.named_parameters())
      if (!param->trainable) out.push_back({state_model_key(name), param->shape, 0, param->value});
  return out;
}

void load_optimizer(const CheckpointReader& reader, Fsdp& fsdp, AdamW& adamw, int rank) {
  const auto units = fsdp.units();
  for (size_t u = 0; u < units.size(); ++u) {
    auto& state = adamw.states()[u];
    for (auto& p : units[u]->params) {
      const int64_t rows = p.layout.rows(rank), begin = p.layout.row_begin(rank);
      for (const auto& [prefix, flat] : {std::pair<std::string, at::Tensor>{kExpAvg, state.exp_avg},
                                         std::pair<std::string, at::Tensor>{kExpAvgSq, state.exp_avg_sq}}) {
        const auto key = prefix + p.name;
        if (!reader.contains(key)) fail("checkpoint ", reader.dir(), ": missing tensor '", key, "'");
        auto view = p.view_of(flat);
        view.zero_();
        if (rows > 0) view.narrow(0, 0, rows).copy_(reader.read_rows(key, begin, begin + rows));
      }
    }
  }
}

}  // namespace

std::string state_model_key(const std::string& param_name) { return "model." + param_name; }

std::string state_save(const std::string& save_root, Comm& comm, Model& model, Fsdp& fsdp, const AdamW* adamw,
                       const StateInfo& info) {
  nlohmann::json global = {{"iteration", info.iteration}, {"model_id", info.model_id}, {"config", info.config}};
  if (adamw) {
    global["consumed_samples"] = info.iteration * info.global_batch_size;
    global["global_batch_size"] = info.global_batch_size;
    global["optimizer_step"] = adamw->step_count();
  } else {
    global["model_only"] = true;
  }
  for (const auto& [key, value] : info.extra.items()) global[key] = value;
  const nlohmann::json rank_state = {{"cpu_rng_state", to_hex(at::detail::getDefaultCPUGenerator().get_state())}};
  return checkpoint_save(save_root, info.iteration, comm, sharded_tensors(model, fsdp, adamw, comm.rank()), global,
                         rank_state, info.plan);
}

void state_load_model(const CheckpointReader& reader, Model& model, Fsdp& fsdp) {
  for (auto& [name, param] : model.named_parameters()) {
    const auto key = state_model_key(name);
    if (!reader.contains(key)) fail("checkpoint ", reader.dir(), ": missing tensor '", key, "'");
    if (reader.global_shape(key) != param->shape)
      fail("checkpoint ", reader.dir(), ": '", key, "' has shape ", shape_str(reader.global_shape(key)),
           ", the model expects ", shape_str(param->shape));
    if (!param->trainable) param->value = reader.read_full(key).to(fsdp.device(), at::kFloat);
  }
  fsdp.load_params(
      [&](const std::string& name, int64_t b, int64_t e) { return reader.read_rows(state_model_key(name), b, e); });
}

StateLoaded state_load(const std::string& path, Comm& comm, Model& model, Fsdp& fsdp, AdamW& adamw,
                       const StateLoadOptions& options) {
  CheckpointReader reader(path);
  const auto& global = reader.global_state();
  StateLoaded loaded;
  loaded.dir = reader.dir();
  loaded.saved_world_size = reader.saved_world_size();
  const std::string saved_model = global.at("model_id").get<std::string>();
  if (saved_model != options.model_id)
    fail("cannot resume from ", reader.dir(), ": it holds model '", saved_model, "', the config builds '",
         options.model_id, "'");
  // A model-only checkpoint (`mmtrain convert ... hf-to-ckpt`) starts a fresh run from its weights.
  if (global.value("model_only", false)) {
    state_load_model(reader, model, fsdp);
    loaded.model_only = true;
    return loaded;
  }
  const int64_t saved_gbs = global.at("global_batch_size").get<int64_t>();
  if (saved_gbs != options.global_batch_size)
    fail("cannot resume from ", reader.dir(), ": it was trained with global batch size ", saved_gbs, " (world size ",
         reader.saved_world_size(), "), this run has ", options.global_batch_size, " (world size ", comm.world_size(),
         "); choose micro_batch_size/gradient_accumulation_steps so they match");
  state_load_model(reader, model, fsdp);
  if (options.load_optimizer) {
    load_optimizer(reader, fsdp, adamw, fsdp.comm().rank());
    adamw.set_step_count(global.at("optimizer_step").get<int64_t>());
  }
  // Each rank restores its own RNG stream; on another world size there is no stream to restore.
  if (options.load_rng && reader.saved_world_size() == comm.world_size()) {
    const auto rank_state = reader.rank_state(comm.rank());
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    generator.set_state(from_hex(rank_state.at("cpu_rng_state").get<std::string>()));
  }
  loaded.iteration = global.at("iteration").get<int64_t>();
  return loaded;
}

}  // namespace mmtrain
