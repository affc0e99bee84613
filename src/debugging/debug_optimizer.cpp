#include "debugging/debug_optimizer.h"

#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "dist/runtime.h"
#include "fsdp/fully_shard.h"
#include "io/safetensors.h"
#include "nn/module.h"
#include "train/build.h"
#include "train/state_adamw8bit.h"

#include <map>

namespace mmtrain {
namespace {

const std::string kParam = "param.";

// The params of the input file, shapes checked against their grads.
std::map<std::string, std::vector<int64_t>> read_shapes(const SafetensorsFile& file, int64_t steps) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& key : file.names()) {
    if (key.rfind(kParam, 0) != 0) continue;
    const auto& info = file.info(key);
    if (info.dtype != at::kFloat || info.shape.empty())
      fail("debug optimizer-steps: ", file.path(), ": '", key, "' must be fp32 with at least one dim, found ",
           info.dtype, " of ", info.shape.size(), " dims");
    shapes[key.substr(kParam.size())] = info.shape;
  }
  if (shapes.empty()) fail("debug optimizer-steps: ", file.path(), " holds no param.<name> tensor");
  for (const auto& [name, shape] : shapes)
    for (int64_t k = 1; k <= steps; ++k) {
      const std::string key = "grad." + std::to_string(k) + "." + name;
      if (!file.contains(key) || file.info(key).dtype != at::kFloat || file.info(key).shape != shape)
        fail("debug optimizer-steps: ", file.path(), ": expected '", key, "', fp32 shaped like its param");
    }
  return shapes;
}

}  // namespace

void debug_optimizer_steps(const DebugOptimizerOptions& o) {
  if (o.steps < 1) fail("debug optimizer-steps: --steps must be >= 1, found ", o.steps);
  const SafetensorsFile file(o.tensors_path, SafetensorsFile::Symlinks::refuse);
  const auto shapes = read_shapes(file, o.steps);
  Runtime runtime = runtime_init(LaunchEnv::from_environment(), Device::cpu);
  const int rank = runtime.comm->rank();

  ModuleGroup model;
  for (const auto& [name, shape] : shapes) model.add_param(name, shape);
  Fsdp fsdp(model, runtime.comm, FsdpConfig{});
  fsdp.load_params([&](const std::string& name, int64_t b, int64_t e) { return file.read_rows(kParam + name, b, e); });
  FsdpUnit& unit = *fsdp.units().at(0);

  Comm* comm = runtime.comm.get();
  AdamW8bit optimizer({unit.shard_flat}, {unit.grad_flat}, fsdp_param_spans(fsdp), rank,
                      AdamW8bitOptions{AdamWOptions{o.beta1, o.beta2, o.eps, o.weight_decay}, o.min_8bit_size},
                      [comm](at::Tensor& absmax) { comm->all_reduce_max(absmax).wait(); });
  for (int64_t k = 1; k <= o.steps; ++k) {
    for (const auto& param : unit.params) {
      const int64_t rows = param.layout.rows(rank), begin = param.layout.row_begin(rank);
      if (rows > 0)
        param.view_of(unit.grad_flat).narrow(0, 0, rows).copy_(file.read_rows("grad." + std::to_string(k) + "." + param.name, begin, begin + rows));
    }
    optimizer.step(o.lr);
    std::vector<ShardedTensor> tensors;
    for (const auto& param : unit.params) {
      const int64_t rows = param.layout.rows(rank);
      tensors.push_back({"model." + param.name, param.param->shape, param.layout.row_begin(rank), param.shard.narrow(0, 0, rows)});
      for (auto& shard : adamw8bit_param_shards(optimizer, 0, param, rank, [](const std::string&, const at::Tensor& t) { return t; }))
        tensors.push_back(std::move(shard));
    }
    checkpoint_save(o.save_dir, k, *runtime.comm, tensors, {{"iteration", k}, {"optimizer_step", k}}, nlohmann::json::object(),
                    nlohmann::json::object());
  }
  if (rank == 0) std::printf("debug optimizer-steps: %lld steps of %zu params on %d ranks -> %s\n",
                             static_cast<long long>(o.steps), shapes.size(), runtime.comm->world_size(), o.save_dir.c_str());
}

}  // namespace mmtrain
