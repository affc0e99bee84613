// The distributed runtime: reads torchrun's environment exactly as
// init_process_group("env://") does, connects the store and builds the c10d backend.
//
//   RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT   rendezvous
//   TORCHELASTIC_USE_AGENT_STORE=True   torchrun's agent already serves MASTER_PORT: connect only
//   TORCHELASTIC_RESTART_COUNT          store prefix, so a restarted attempt gets fresh keys
//   GLOO_SOCKET_IFNAME                  network interface for Gloo (else the host's default)
//
// No WORLD_SIZE in the environment means a single process with no backend at all.
#pragma once
#include "dist/comm.h"
#include "dist/peer_watch.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace mmtrain {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;  // ranks on this node (torchrun's LOCAL_WORLD_SIZE): they share its memory
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool use_agent_store = false;
  int restart_count = 0;

  static LaunchEnv from_environment();
};

enum class Device { cpu, cuda };

// MMTRAIN_DEVICE=cpu|cuda if set; else cuda when this build has CUDA and a GPU is visible.
Device default_device();

struct Runtime {
  LaunchEnv env;
  Device device = Device::cpu;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<PeerWatch> peer_watch;  // every rank's heartbeat (null for one process)
};

// Connects to the rendezvous of env and builds a Gloo (cpu) or NCCL (cuda) backend.
Runtime runtime_init(const LaunchEnv& env, Device device,
                     std::chrono::milliseconds timeout = std::chrono::minutes(10));

// A backend over an existing store: used by runtime_init and by thread-per-rank tests.
c10::intrusive_ptr<c10d::Backend> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int world_size, Device device,
                                               std::chrono::milliseconds timeout);

}  // namespace mmtrain
