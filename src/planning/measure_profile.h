// `mmtrain measure profile`: a device profile (plan/device_profile.h) of this machine, from
// measurements rather than a datasheet, so that the step-time model of a CPU run here has figures
// of its own:
//   peak_bf16_tflops, peak_fp32_tflops   a square GEMM per dtype (measure gemm), median of repeats
//   attention efficiency                 ATen's attention forward + backward (bf16, one long
//                                        sequence) in FLOP/s over the bf16 GEMM's
//   memory_gb_per_s (and host link, host memory: on a CPU they are the same RAM)
//                                        a large copy, read + write bytes over its time
//   intra_node_gb_per_s                  Gloo all-reduce over loopback between thread ranks, bus
//                                        bandwidth as nccl-tests counts it: 2 (W-1)/W x bytes / time
//   inter_node_gb_per_s                  not measurable on one machine: the intra-node figure
//   disk_read/write_gb_per_s             the disk tier's own path (offload/disk_store.h, direct I/O
//                                        where the filesystem allows) in the given directory
//   memory_gb, host_memory_gb            the machine's RAM (MemTotal)
// Efficiencies: gemm and comm 1 (their peaks are measured rates), overlap 0.5 (Gloo on a CPU
// takes cores from compute): starting points for calibration. The profile's "sources" say how and
// when each figure was measured.
#pragma once
#include <string>

namespace mmtrain {

struct MeasureProfileOptions {
  std::string out;           // the JSON file written (refused when it exists, unless overwrite)
  std::string name = "local";
  std::string disk_dir = "/tmp";
  int threads = 1;           // intra-op threads, as one rank of a run here uses
  int ranks = 2;             // thread ranks for the all-reduce
  int64_t gemm_size = 1024;
  int64_t copy_mb = 256, allreduce_mb = 64, disk_mb = 256;
  bool overwrite = false;
};

void measure_profile(const MeasureProfileOptions& options);

}  // namespace mmtrain
