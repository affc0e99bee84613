#include "planning/cp_attention_bench.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/statistics.h"
#include "dist/device_mesh.h"
#include "dist/runtime.h"
#include "parallel/context_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace mmtrain {

void measure_cp_attention(const CpAttentionBench& o) {
  const auto dtype = dtype_parse(o.dtype);
  if (!dtype) fail("measure cp-attention: --dtype must be fp32, bf16 or fp16, found '", o.dtype, "'");
  if (o.seqlen < 1 || o.heads < 1 || o.kv_heads < 1 || o.head_dim < 1 || o.repeats < 1 || o.warmup < 0)
    fail("measure cp-attention: sizes and --repeats must be >= 1");
  auto runtime = runtime_init(LaunchEnv::from_environment(), Device::cpu);
  const int world = runtime.comm->world_size();
  if (world != o.ring * o.ulysses)
    fail("measure cp-attention: --ring ", o.ring, " x --ulysses ", o.ulysses, " needs ", o.ring * o.ulysses,
         " ranks, the world has ", world);
  MeshShape shape;
  shape.ring = o.ring;
  shape.ulysses = o.ulysses;
  const DeviceMesh mesh = world == 1 ? DeviceMesh::single(runtime.comm)
                                     : DeviceMesh(shape, runtime.comm, runtime.store, runtime.device);
  const auto shard = world > 1 ? ContextParallel(mesh.ring(), mesh.ulysses(), mesh.cp()).split({0, o.seqlen}, o.causal)
                               : whole_sequence({0, o.seqlen});

  auto gen = at::make_generator<at::CPUGeneratorImpl>(1 + mesh.rank());
  const int64_t rows = shard->local_rows();
  auto q = at::randn({rows, o.heads, o.head_dim}, gen).to(*dtype).requires_grad_(true);
  auto k = at::randn({rows, o.kv_heads, o.head_dim}, gen).to(*dtype).requires_grad_(true);
  auto v = at::randn({rows, o.kv_heads, o.head_dim}, gen).to(*dtype).requires_grad_(true);
  auto grad = at::randn({rows, o.heads, o.head_dim}, gen).to(*dtype);

  using clock = std::chrono::steady_clock;
  std::vector<double> forward_ms, step_ms;
  for (int i = 0; i < o.warmup + o.repeats; ++i) {
    runtime.comm->barrier();
    const auto start = clock::now();
    auto out = shard->attention(q, k, v, o.causal);
    runtime.comm->barrier();
    const auto forward_done = clock::now();
    out.backward(grad);
    runtime.comm->barrier();
    const auto done = clock::now();
    q.mutable_grad().reset();
    k.mutable_grad().reset();
    v.mutable_grad().reset();
    if (i < o.warmup) continue;
    forward_ms.push_back(std::chrono::duration<double, std::milli>(forward_done - start).count());
    step_ms.push_back(std::chrono::duration<double, std::milli>(done - start).count());
  }
  if (mesh.rank() != 0) return;
  const nlohmann::ordered_json j = {{"ring", o.ring},
                                    {"ulysses", o.ulysses},
                                    {"seqlen", o.seqlen},
                                    {"local_rows", rows},
                                    {"heads", o.heads},
                                    {"kv_heads", o.kv_heads},
                                    {"head_dim", o.head_dim},
                                    {"causal", o.causal},
                                    {"dtype", dtype_name(*dtype)},
                                    {"forward_ms", median(forward_ms)},
                                    {"forward_backward_ms", median(step_ms)}};
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace mmtrain
