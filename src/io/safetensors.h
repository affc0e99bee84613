// Safetensors, the HF tensor file format, written and read by hand: an 8-byte little-endian header
// length N, N bytes of JSON (padded with spaces to a multiple of 8), then the raw row-major
// little-endian bytes of every tensor, back to back. Reading validates the whole header before any
// data is touched and reads tensors (or row ranges of them) with pread; writing is atomic (a crash
// never leaves a half file under the final name) and byte-reproducible. Non-goals: mmap, big-endian
// hosts, dtypes LibTorch has no ScalarType for (F8_E8M0, F4, F6_*).
#pragma once
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mmtrain {

// "BF16" <-> at::kBFloat16 and so on, for every dtype both sides know.
std::optional<at::ScalarType> safetensors_dtype_parse(const std::string& name);
std::string safetensors_dtype_name(at::ScalarType dtype);  // fails for dtypes safetensors lacks

struct SafetensorsTensorInfo {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  int64_t data_begin = 0;  // byte offsets relative to the start of the data section (8 + N)
  int64_t data_end = 0;
};

// Writes tensors in the given order with `metadata` as "__metadata__" (omitted when empty). The
// header is laid out exactly as the reference (Rust) writer lays it out: "__metadata__" first,
// then the tensors in data order, compact JSON, space padding. So reading a file written by
// `safetensors.torch.save_file` and writing it back with names() order and the same metadata
// reproduces it byte for byte (when its metadata has at most one key: the reference writer emits
// keys in hash order, we emit them sorted). Non-contiguous or non-CPU tensors are copied first.
// Writes `path + ".tmp"`, fsyncs it, then renames it to `path`.
void safetensors_write(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// The same, with each tensor produced only when its bytes are written (one at a time: a file
// larger than memory streams through it). fetch must return a tensor of exactly that dtype and
// shape.
struct SafetensorsSource {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::function<at::Tensor()> fetch;
};
void safetensors_write_streamed(const std::string& path, const std::vector<SafetensorsSource>& sources,
                                const std::map<std::string, std::string>& metadata = {});

// One open safetensors file. The constructor validates the header against the file size (every
// problem is an mmtrain::Error naming the file and, where there is one, the tensor); reads never
// load more than they return. Reads are const and use pread: safe from several threads at once.
class SafetensorsFile {
 public:
  // Symlinks::refuse opens with O_NOFOLLOW (a checkpoint's own files: a link out of its directory is
  // refused naming the file); follow is for model directories, which HF caches build from links.
  enum class Symlinks { follow, refuse };
  explicit SafetensorsFile(const std::string& path, Symlinks symlinks = Symlinks::follow);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names in header order (which is data order for files written by safetensors or by us).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const SafetensorsTensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // The whole tensor, as an owned contiguous CPU tensor.
  at::Tensor read(const std::string& name) const;
  // Rows [row_begin, row_end) of dim 0: shape [row_end - row_begin, shape[1:]...]. Only those bytes
  // are read from disk.
  at::Tensor read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const;
  // Same, into `out`: a contiguous CPU tensor of the file's dtype and the shape above (for loading
  // straight into preallocated shards or into a slice of a larger buffer).
  void read_rows_into(const std::string& name, int64_t row_begin, int64_t row_end,
                      const at::Tensor& out) const;
  // The tensor's stored bytes, handed to `consume` in bounded chunks (16 MiB), so a tensor larger
  // than memory can be fingerprinted.
  void for_each_data_chunk(const std::string& name, const std::function<void(const char*, size_t)>& consume) const;

 private:
  void pread_exact(void* dst, int64_t nbytes, int64_t file_offset, const std::string& name) const;

  std::string path_;
  int fd_ = -1;
  int64_t data_start_ = 0;  // 8 + header length
  std::vector<std::string> names_;
  std::unordered_map<std::string, SafetensorsTensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

// A directory holding one HF model's weights: either shards named by `model.safetensors.index.json`
// ({"metadata": {...}, "weight_map": {"tensor": "model-00001-of-00007.safetensors", ...}}) or a
// single `model.safetensors`. Every shard is opened (and validated) by the constructor, and every
// name in the weight map must exist in the shard it points at.
class SafetensorsIndex {
 public:
  explicit SafetensorsIndex(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Tensor names in weight-map order (file order for a single model.safetensors).
  const std::vector<std::string>& names() const { return names_; }
  bool contains(const std::string& name) const { return file_of_.count(name) != 0; }
  // The shard file (name relative to dir()) holding `name`.
  const std::string& file_name(const std::string& name) const;
  const SafetensorsFile& file(const std::string& name) const;
  // Shard file names in order of first appearance in the weight map.
  const std::vector<std::string>& file_names() const { return file_names_; }
  // The index's "metadata" object (e.g. {"total_size": ...}); empty for a single file.
  const nlohmann::ordered_json& metadata() const { return metadata_; }
  bool sharded() const { return sharded_; }

  const SafetensorsTensorInfo& info(const std::string& name) const { return file(name).info(name); }
  at::Tensor read(const std::string& name) const { return file(name).read(name); }
  at::Tensor read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const {
    return file(name).read_rows(name, row_begin, row_end);
  }

 private:
  std::string dir_;
  bool sharded_ = false;
  nlohmann::ordered_json metadata_ = nlohmann::ordered_json::object();
  std::vector<std::string> names_;
  std::unordered_map<std::string, std::string> file_of_;
  std::vector<std::string> file_names_;
  std::unordered_map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// Writes `model.safetensors.index.json`-style JSON: {"metadata": metadata, "weight_map": {...}}
// with keys in the given order, as Python's json.dumps(indent=2) + "\n" formats it (ASCII-escaped).
// HF's save_pretrained sorts every key; pass them sorted to reproduce its files. Atomic (tmp +
// rename).
void safetensors_index_write(const std::string& path, const nlohmann::ordered_json& metadata,
                             const std::vector<std::pair<std::string, std::string>>& weight_map);

}  // namespace mmtrain
