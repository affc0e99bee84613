#include "io/safetensors.h"

#include "core/error.h"
#include "core/json_read.h"
#include "core/regular_file.h"
#include "core/text.h"
#include "io/atomic_file.h"
#include "io/safetensors_header.h"
#include "io/user_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <tuple>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors data is little-endian; this reader copies bytes as they are");

namespace mmtrain {
namespace {

namespace fs = std::filesystem;

struct DtypeName {
  const char* name;
  at::ScalarType dtype;
};

// Every safetensors dtype LibTorch has a ScalarType for (the names safetensors.torch uses).
constexpr DtypeName kDtypes[] = {
    {"BOOL", at::kBool},         {"U8", at::kByte},
    {"I8", at::kChar},           {"I16", at::kShort},
    {"U16", at::kUInt16},        {"F16", at::kHalf},
    {"BF16", at::kBFloat16},     {"I32", at::kInt},
    {"U32", at::kUInt32},        {"F32", at::kFloat},
    {"F64", at::kDouble},        {"I64", at::kLong},
    {"U64", at::kUInt64},        {"C64", at::kComplexFloat},
    {"F8_E4M3", at::kFloat8_e4m3fn},     {"F8_E5M2", at::kFloat8_e5m2},
    {"F8_E4M3FNUZ", at::kFloat8_e4m3fnuz}, {"F8_E5M2FNUZ", at::kFloat8_e5m2fnuz},
};

constexpr const char* kMetadataKey = "__metadata__";

// numel * itemsize of `shape`, or nullopt on int64 overflow (a hostile header must not wrap).
std::optional<int64_t> checked_nbytes(const std::vector<int64_t>& shape, int64_t itemsize) {
  int64_t n = itemsize;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  return n;
}

}  // namespace

std::optional<at::ScalarType> safetensors_dtype_parse(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.dtype;
  return std::nullopt;
}

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.dtype) return d.name;
  fail("safetensors has no dtype for ", c10::toString(dtype));
}

// ---------------------------------------------------------------------------------------------
// Writing

void safetensors_write(const std::string& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<SafetensorsSource> sources;
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) fail("safetensors_write ", path, ": tensor '", name, "' is undefined");
    sources.push_back({name, tensor.scalar_type(), tensor.sizes().vec(), [t = tensor] { return t; }});
  }
  safetensors_write_streamed(path, sources, metadata);
}

void safetensors_write_streamed(const std::string& path, const std::vector<SafetensorsSource>& sources,
                                const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& meta = header[kMetadataKey] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
  }
  int64_t offset = 0;
  for (const auto& source : sources) {
    const auto& name = source.name;
    if (name == kMetadataKey) fail("safetensors_write ", path, ": tensor name '", name, "' is reserved");
    if (header.contains(name)) fail("safetensors_write ", path, ": tensor '", name, "' given twice");
    int64_t numel = 1;
    for (int64_t d : source.shape) numel *= d;
    const int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(source.dtype));
    header[name] = {{"dtype", safetensors_dtype_name(source.dtype)},
                    {"shape", source.shape},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors_write ", path, ": a tensor name or metadata value is not valid UTF-8 (", e.what(), ")");
  }
  json.append((8 - json.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const uint64_t header_len = json.size();      // little-endian on every host we build for

  AtomicFile file(path, AtomicFile::Direct::when_supported);
  file.write(&header_len, sizeof(header_len));
  file.write(json.data(), json.size());
  for (const auto& source : sources) {
    const at::Tensor tensor = source.fetch();
    if (!tensor.defined() || tensor.scalar_type() != source.dtype || tensor.sizes().vec() != source.shape)
      fail("safetensors_write ", path, ": tensor '", source.name, "' was announced as ",
           safetensors_dtype_name(source.dtype), " of ", source.shape.size(), " dims, but came out different");
    if (tensor.numel() == 0) continue;
    // One tensor at a time: a rank's shards of a large model must not all be copied at once.
    at::Tensor cpu = tensor.device().is_cpu() ? tensor : tensor.to(at::kCPU);
    cpu = cpu.resolve_conj().resolve_neg().contiguous();  // lazy conj/neg views: write the values
    file.write(cpu.data_ptr(), cpu.numel() * cpu.element_size());
  }
  file.commit();
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile::SafetensorsFile(const std::string& path, Symlinks symlinks) : path_(path) {
  // Before open(): opening a FIFO would block until something writes to it.
  require_regular_file(path, "safetensors file " + path, "a .safetensors file");
  // O_NONBLOCK: a FIFO swapped in after that check does not block the open either (reads of a
  // regular file ignore the flag).
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | (symlinks == Symlinks::refuse ? O_NOFOLLOW : 0));
  if (fd_ < 0 && errno == ELOOP)
    fail("safetensors file ", path, ": refused: a symlink (a checkpoint's files must be plain files in its directory)");
  if (fd_ < 0) fail("safetensors file ", path, ": cannot open: ", std::strerror(errno));
  // From here on a failure must close fd_: the destructor does not run for a throwing constructor.
  try {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) fail("safetensors file ", path, ": cannot stat: ", std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("safetensors file ", path, ": not a regular file");
    const int64_t file_size = st.st_size;
    if (file_size < 8)
      fail("safetensors file ", path, ": expected at least 8 bytes (header length), found ", file_size,
           " bytes (truncated?)");
    uint64_t header_len = 0;
    pread_exact(&header_len, 8, 0, "header length");
    if (header_len > static_cast<uint64_t>(file_size - 8))
      fail("safetensors file ", path, ": header length ", header_len, " runs past the end of the file (",
           file_size, " bytes: at most ", file_size - 8, " header bytes fit; truncated?)");
    data_start_ = 8 + static_cast<int64_t>(header_len);
    const int64_t data_size = file_size - data_start_;

    // Capped before a byte of it is allocated; parsed as it streams, never into a DOM
    // (safetensors_header.h).
    if (header_len > kMaxSafetensorsHeaderBytes)
      fail("safetensors file ", path, ": header length ", header_len, " bytes, over the ", kMaxSafetensorsHeaderBytes,
           " a safetensors header may hold (the reference reader's cap)");
    struct Span {
      int64_t begin, end;
      size_t index;  // into names_
    };
    std::vector<Span> spans;
    auto add = [&](SafetensorsHeaderEntry&& entry) {
      const auto where = [&] { return "safetensors file " + path + ": tensor '" + entry.name + "': "; };
      SafetensorsTensorInfo info;
      const auto parsed = safetensors_dtype_parse(entry.dtype);
      if (!parsed) fail(where(), "unknown dtype \"", entry.dtype, "\"");
      info.dtype = *parsed;
      info.shape = std::move(entry.shape);
      const uint64_t begin = entry.data_begin, end = entry.data_end;
      if (begin > end || end > static_cast<uint64_t>(data_size))
        fail(where(), "data_offsets [", begin, ", ", end, "] out of range: the data section holds ", data_size,
             " bytes (truncated file?)");
      info.data_begin = static_cast<int64_t>(begin);
      info.data_end = static_cast<int64_t>(end);
      auto nbytes = checked_nbytes(info.shape, static_cast<int64_t>(c10::elementSize(info.dtype)));
      if (!nbytes || *nbytes != info.data_end - info.data_begin)
        fail(where(), "data_offsets [", begin, ", ", end, "] span ", end - begin, " bytes, but shape ",
             shape_str(info.shape), " of ", entry.dtype, " needs ",
             nbytes ? std::to_string(*nbytes) : std::string("more than 2^63"), " bytes");
      spans.push_back({info.data_begin, info.data_end, names_.size()});
      if (!infos_.emplace(entry.name, std::move(info)).second) fail(where(), "given twice");
      names_.push_back(std::move(entry.name));
    };
    {
      std::string text(header_len, '\0');
      pread_exact(text.data(), static_cast<int64_t>(header_len), 8, "header");
      metadata_ = safetensors_header_parse(text, "safetensors file " + path + ": header", add);
    }

    // The tensors must tile the data section exactly: no gap, no overlap, nothing left over.
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
    });
    int64_t cursor = 0;
    size_t previous = 0;
    for (const auto& span : spans) {
      if (span.begin < cursor)
        fail("safetensors file ", path, ": tensor '", names_[span.index], "' bytes [", span.begin, ", ",
             span.end, ") overlap tensor '", names_[previous], "' (which ends at ", cursor, ")");
      if (span.begin > cursor)
        fail("safetensors file ", path, ": gap in the data section: bytes [", cursor, ", ", span.begin,
             ") before tensor '", names_[span.index], "' belong to no tensor");
      cursor = span.end;
      previous = span.index;
    }
    if (cursor != data_size)
      fail("safetensors file ", path, ": data section is ", data_size, " bytes but its tensors cover ", cursor,
           " bytes", cursor < data_size ? " (trailing garbage)" : "");
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      data_start_(other.data_start_),
      names_(std::move(other.names_)),
      infos_(std::move(other.infos_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    data_start_ = other.data_start_;
    names_ = std::move(other.names_);
    infos_ = std::move(other.infos_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

void SafetensorsFile::pread_exact(void* dst, int64_t nbytes, int64_t file_offset,
                                  const std::string& name) const {
  char* p = static_cast<char*>(dst);
  while (nbytes > 0) {
    ssize_t n = ::pread(fd_, p, static_cast<size_t>(nbytes), file_offset);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("safetensors file ", path_, ": cannot read '", name, "': ", std::strerror(errno));
    }
    if (n == 0)
      fail("safetensors file ", path_, ": unexpected end of file reading '", name, "' at byte ", file_offset,
           " (file truncated after it was opened?)");
    p += n;
    file_offset += n;
    nbytes -= n;
  }
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = infos_.find(name);
  if (it == infos_.end()) fail("safetensors file ", path_, ": no tensor named '", name, "'");
  return it->second;
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const auto& meta = info(name);
  auto out = at::empty(meta.shape, at::TensorOptions().dtype(meta.dtype));
  if (meta.data_end > meta.data_begin)
    pread_exact(out.data_ptr(), meta.data_end - meta.data_begin, data_start_ + meta.data_begin, name);
  return out;
}

at::Tensor SafetensorsFile::read_rows(const std::string& name, int64_t row_begin, int64_t row_end) const {
  const auto& meta = info(name);
  std::vector<int64_t> shape = meta.shape;
  if (!shape.empty() && row_begin >= 0 && row_begin <= row_end) shape[0] = row_end - row_begin;
  auto out = at::empty(shape, at::TensorOptions().dtype(meta.dtype));
  read_rows_into(name, row_begin, row_end, out);
  return out;
}

void SafetensorsFile::read_rows_into(const std::string& name, int64_t row_begin, int64_t row_end,
                                     const at::Tensor& out) const {
  const auto& meta = info(name);
  if (meta.shape.empty())
    fail("safetensors file ", path_, ": tensor '", name, "' is 0-dim and has no rows: use read()");
  if (row_begin < 0 || row_begin > row_end || row_end > meta.shape[0])
    fail("safetensors file ", path_, ": tensor '", name, "' rows [", row_begin, ", ", row_end,
         ") out of range: it has ", meta.shape[0], " rows");
  std::vector<int64_t> shape = meta.shape;
  shape[0] = row_end - row_begin;
  if (!out.defined() || !out.device().is_cpu() || !out.is_contiguous() || out.scalar_type() != meta.dtype ||
      out.sizes().vec() != shape)
    fail("safetensors file ", path_, ": read_rows_into '", name, "': expected a contiguous CPU ",
         c10::toString(meta.dtype), " tensor of shape ", shape_str(shape), ", found ",
         out.defined() ? out.toString() + " " + shape_str(out.sizes().vec()) : std::string("undefined"));
  // shape[1:] fits: the whole tensor's byte count was checked against the file at open.
  const int64_t row_bytes = meta.shape[0] == 0 ? 0 : (meta.data_end - meta.data_begin) / meta.shape[0];
  const int64_t nbytes = (row_end - row_begin) * row_bytes;
  if (nbytes > 0) pread_exact(out.data_ptr(), nbytes, data_start_ + meta.data_begin + row_begin * row_bytes, name);
}

void SafetensorsFile::for_each_data_chunk(const std::string& name,
                                          const std::function<void(const char*, size_t)>& consume) const {
  const auto& meta = info(name);
  constexpr int64_t kChunkBytes = int64_t{16} << 20;
  std::vector<char> chunk(static_cast<size_t>(std::min(kChunkBytes, meta.data_end - meta.data_begin)));
  for (int64_t at = meta.data_begin; at < meta.data_end; at += kChunkBytes) {
    const int64_t n = std::min(kChunkBytes, meta.data_end - at);
    pread_exact(chunk.data(), n, data_start_ + at, name);
    consume(chunk.data(), static_cast<size_t>(n));
  }
}

// ---------------------------------------------------------------------------------------------
// Directories of HF shards

namespace {
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
}  // namespace

SafetensorsIndex::SafetensorsIndex(const std::string& dir) : dir_(dir) {
  const fs::path root(dir);
  const fs::path index_path = root / kIndexName;
  auto open_file = [&](const std::string& file_name) -> SafetensorsFile& {
    auto& slot = files_[file_name];
    if (!slot) {
      slot = std::make_unique<SafetensorsFile>((root / file_name).string());
      file_names_.push_back(file_name);
    }
    return *slot;
  };
  if (fs::exists(index_path)) {
    sharded_ = true;
    const std::string where = index_path.string();
    const auto index = ordered_json_parse_checked(read_user_file(where, "safetensors index " + where, kMaxSmallJsonBytes),
                                                  "safetensors index " + where);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail("safetensors index ", where, ": expected an object with a \"weight_map\" object");
    if (index.contains("metadata")) {
      if (!index["metadata"].is_object() && !index["metadata"].is_null())
        fail("safetensors index ", where, ": \"metadata\" must be an object, found ", index["metadata"].dump());
      if (index["metadata"].is_object()) metadata_ = index["metadata"];
    }
    for (const auto& [name, file_value] : index["weight_map"].items()) {
      if (!file_value.is_string())
        fail("safetensors index ", where, ": weight_map['", name, "'] must be a file name, found ",
             file_value.dump());
      const std::string file_name = file_value.get<std::string>();
      if (file_name.empty() || fs::path(file_name).is_absolute() || file_name.find("..") != std::string::npos)
        fail("safetensors index ", where, ": weight_map['", name, "'] = '", file_name,
             "': expected a file name inside ", dir);
      const auto& file = open_file(file_name);
      if (!file.contains(name))
        fail("safetensors index ", where, ": weight_map puts '", name, "' in ", file.path(),
             " but that file has no such tensor");
      names_.push_back(name);
      file_of_[name] = file_name;
    }
  } else if (fs::exists(root / kSingleName)) {
    const auto& file = open_file(kSingleName);
    for (const auto& name : file.names()) {
      names_.push_back(name);
      file_of_[name] = kSingleName;
    }
  } else {
    fail("safetensors directory ", dir, ": expected ", kIndexName, " or ", kSingleName, " in it, found neither");
  }
}

const std::string& SafetensorsIndex::file_name(const std::string& name) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end())
    fail("safetensors directory ", dir_, ": no tensor named '", name, "' in ",
         sharded_ ? kIndexName : kSingleName);
  return it->second;
}

const SafetensorsFile& SafetensorsIndex::file(const std::string& name) const {
  return *files_.at(file_name(name));
}

void safetensors_index_write(const std::string& path, const nlohmann::ordered_json& metadata,
                             const std::vector<std::pair<std::string, std::string>>& weight_map) {
  nlohmann::ordered_json index = nlohmann::ordered_json::object();
  index["metadata"] = metadata.is_null() ? nlohmann::ordered_json::object() : metadata;
  auto& map = index["weight_map"] = nlohmann::ordered_json::object();
  for (const auto& [name, file] : weight_map) {
    if (map.contains(name)) fail("safetensors_index_write ", path, ": tensor '", name, "' given twice");
    map[name] = file;
  }
  // json.dumps(indent=2) style: 2-space indent, ": " and "," separators, \uXXXX for non-ASCII.
  file_write_atomic(path, index.dump(2, ' ', /*ensure_ascii=*/true) + "\n");
}

}  // namespace mmtrain
