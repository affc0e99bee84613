// A device profile: what the step-time model (plan/step_time.h) needs to know of the hardware a
// run is planned for, per device. The public parts ship as JSON files in profiles/ (h200, h100,
// a100, 910b3), each figure with its public source in the file's "sources"; a path to such a
// file works too. Units: TFLOP/s, GB (10^9 bytes) and GB/s, per device and one direction.
//
//   peak_bf16_tflops, peak_fp32_tflops   dense peak of the compute units per dtype
//   memory_gb, memory_gb_per_s           device memory and its bandwidth
//   intra_node_gb_per_s                  collective bandwidth between devices of one node
//   inter_node_gb_per_s                  the same across nodes (the device's share of the NICs)
//   host_link_gb_per_s                   device <-> pinned host memory
//   host_memory_gb                       the device's share of the node's host RAM
//   host_memory_gb_per_s                 the device's share of host DRAM bandwidth (a host step)
//   disk_read_gb_per_s, disk_write_gb_per_s   the device's share of the node's offload disk
//   efficiency.{gemm, attention, comm, overlap}   achieved / peak for GEMMs, attention and
//                                        collectives; the share of compute time that can hide
//                                        communication and copies
#pragma once
#include <string>

namespace mmtrain {

struct DeviceProfile {
  std::string name;         // "h200", or the file's "name"
  std::string description;
  double peak_bf16_tflops = 0, peak_fp32_tflops = 0;
  double memory_gb = 0, memory_gb_per_s = 0;
  double intra_node_gb_per_s = 0, inter_node_gb_per_s = 0, host_link_gb_per_s = 0;
  double host_memory_gb = 0, host_memory_gb_per_s = 0;
  double disk_read_gb_per_s = 0, disk_write_gb_per_s = 0;
  double gemm_efficiency = 0, attention_efficiency = 0, comm_efficiency = 0, overlap = 0;
};

// The built-in profile `name` (h200, h100, a100, 910b3: share/mmtrain/profiles/<name>.json beside
// the binary) or the JSON file at that path. Fails naming the profile and the field when a figure
// is missing, not a number, or not positive (efficiencies and overlap in (0, 1]); an unknown name
// lists the built-in ones.
DeviceProfile load_device_profile(const std::string& name_or_path);
// The file a name or path stands for (a built-in's under share/mmtrain/profiles/); fails as above
// for an unknown name.
std::string device_profile_path(const std::string& name_or_path);
// The same from parsed JSON; `where` names it in errors.
DeviceProfile device_profile_from_json(const std::string& text, const std::string& where);

}  // namespace mmtrain
