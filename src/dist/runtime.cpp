#include "dist/runtime.h"

#include "core/error.h"
#include "dist/failure_report.h"

#include <ATen/Context.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef MMTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

namespace mmtrain {
namespace {

const char* env_or_null(const char* name) {
  const char* value = std::getenv(name);
  return (value && *value) ? value : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* value = env_or_null(name);
  if (!value) return fallback;
  try {
    size_t used = 0;
    int parsed = std::stoi(value, &used);
    if (used != std::string(value).size()) throw std::invalid_argument(value);
    return parsed;
  } catch (const std::exception&) {
    fail("environment variable ", name, "='", value, "' is not an integer");
  }
}

}  // namespace

Device default_device() {
  if (const char* name = env_or_null("MMTRAIN_DEVICE")) {
    const std::string value = name;
    if (value == "cpu") return Device::cpu;
    if (value == "cuda") return Device::cuda;
    fail("MMTRAIN_DEVICE='", value, "': expected cpu or cuda");
  }
#ifdef MMTRAIN_CUDA
  if (at::hasCUDA()) return Device::cuda;
#endif
  return Device::cpu;
}

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv env;
  env.world_size = env_int("WORLD_SIZE", 1);
  env.rank = env_int("RANK", 0);
  env.local_rank = env_int("LOCAL_RANK", env.rank);
  env.local_world_size = env_int("LOCAL_WORLD_SIZE", env.world_size);
  if (const char* addr = env_or_null("MASTER_ADDR")) env.master_addr = addr;
  env.master_port = env_int("MASTER_PORT", 29500);
  const char* agent = env_or_null("TORCHELASTIC_USE_AGENT_STORE");
  env.use_agent_store = agent && std::string(agent) == "True";
  env.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  if (env.world_size < 1) fail("WORLD_SIZE must be >= 1, got ", env.world_size);
  if (env.local_world_size < 1 || env.local_world_size > env.world_size)
    fail("LOCAL_WORLD_SIZE=", env.local_world_size, " must be in [1, WORLD_SIZE=", env.world_size, "]");
  if (env.rank < 0 || env.rank >= env.world_size)
    fail("RANK=", env.rank, " is outside WORLD_SIZE=", env.world_size);
  if (env.world_size > 1 && !env_or_null("MASTER_ADDR"))
    fail("WORLD_SIZE=", env.world_size, " but MASTER_ADDR is not set: launch with torchrun");
  return env;
}

c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int world_size, Device device,
                                               std::chrono::milliseconds timeout) {
  if (device == Device::cuda) {
#ifdef MMTRAIN_CUDA
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
#else
    fail("this mmtrain was built without CUDA (configure with -DMMTRAIN_CUDA=ON)");
#endif
  }
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  if (const char* ifname = env_or_null("GLOO_SOCKET_IFNAME")) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  // One worker thread: collectives run one at a time, in the order this rank issued them, as
  // NCCL runs them on one stream. Communication still overlaps compute (the worker is not the
  // training thread); two workers would let an all-gather and a reduce-scatter of different
  // units share one Gloo context concurrently, which buys nothing on one host and is where Gloo
  // has had races (pytorch/gloo#427). A rank aborting mid-run in CI (not reproduced here) was
  // seen with two workers.
  opts->threads = 1;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
}

namespace {

// Under torchrun, die with the agent. torchrun starts each rank in a session of its own, so a
// SIGKILL of torchrun (an OOM killer, a scheduler's kill, kill -9 on the launcher) would
// otherwise leave the ranks training on as orphans and writing checkpoints, with nobody to stop
// them. A normal torchrun exit already stops its ranks; this covers the abrupt one.
void exit_with_launcher() {
  if (!env_or_null("TORCHELASTIC_RUN_ID")) return;
  const pid_t launcher = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return;  // best effort: no worse than before
  if (getppid() != launcher) std::_Exit(1);  // the launcher died before prctl took effect
}

}  // namespace

Runtime runtime_init(const LaunchEnv& env, Device device, std::chrono::milliseconds timeout) {
  exit_with_launcher();
  Runtime rt;
  rt.env = env;
  rt.device = device;
#ifdef MMTRAIN_CUDA
  if (device == Device::cuda) c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
#endif
  const at::Device comm_device = device == Device::cuda ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank))
                                                       : at::Device(at::kCPU);
  if (env.world_size == 1) {
    rt.comm = std::make_shared<Comm>(nullptr, 0, 1, comm_device);
    return rt;
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(env.master_port);
  opts.numWorkers = env.world_size;
  opts.timeout = timeout;
  const std::string attempt_prefix = "/worker/attempt_" + std::to_string(env.restart_count);
  c10::intrusive_ptr<c10d::Store> store;
  if (env.use_agent_store) {
    // torchrun's agent owns the server on MASTER_PORT: every rank is a client.
    opts.isServer = false;
    store = c10::make_intrusive<c10d::PrefixStore>(attempt_prefix,
                                                   c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts));
  } else {
    opts.isServer = env.rank == 0;
    opts.multiTenant = true;
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  }
  rt.store = c10::make_intrusive<c10d::PrefixStore>("mmtrain_default_pg", store);
  rt.comm = std::make_shared<Comm>(make_backend(rt.store, env.rank, env.world_size, device, timeout),
                                   env.rank, env.world_size, comm_device);
  // The heartbeat's own client (every rank has connected by now: the backend's rendezvous waited
  // for all of them), under the same prefixes.
  c10d::TCPStoreOptions client = opts;
  client.isServer = false;
  client.numWorkers = std::nullopt;
  client.waitWorkers = false;
  c10::intrusive_ptr<c10d::Store> heartbeat_store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, client);
  if (env.use_agent_store) heartbeat_store = c10::make_intrusive<c10d::PrefixStore>(attempt_prefix, heartbeat_store);
  // A silent neighbour ends this rank at once (its collectives would wait parallel.timeout_s):
  // the message goes where any rank error goes, then the process exits.
  auto on_silent = [](const std::string& message) {
    std::fprintf(stderr, "mmtrain: error: %s\n", message.c_str());
    report_failure_to_launcher(message);
    std::fflush(nullptr);
    std::_Exit(1);
  };
  rt.peer_watch = std::make_shared<PeerWatch>(c10::make_intrusive<c10d::PrefixStore>("mmtrain_default_pg", heartbeat_store),
                                              env.rank, env.world_size, std::chrono::seconds(1), on_silent);
  return rt;
}

}  // namespace mmtrain
