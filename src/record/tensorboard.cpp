#include "record/tensorboard.h"

#include "core/crc32c.h"
#include "core/error.h"
#include "io/user_file.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace mmtrain {
namespace {

// Protobuf wire format: a key is (field << 3) | wire type; 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86 and aarch64 store it
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

std::string event(int64_t step, const std::string& file_version, const std::string& summary) {
  std::string out;
  put_key(out, 1, 1);  // wall_time
  put_fixed(out, std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  put_key(out, 2, 0);  // step
  put_varint(out, static_cast<uint64_t>(step));
  if (!file_version.empty()) put_bytes(out, 3, file_version);
  if (!summary.empty()) put_bytes(out, 5, summary);
  return out;
}

uint32_t masked_crc(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) fail("logging.tensorboard: cannot create ", dir, ": ", error.message());
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  path_ = dir + "/events.out.tfevents." + std::to_string(std::time(nullptr)) + "." + host + "." +
          std::to_string(::getpid());
  file_ = open_append_no_follow(path_, "logging.tensorboard", /*binary=*/true);
  write_record(event(0, "brain.Event:2", ""));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  std::string summary;
  for (const auto& [tag, value] : values) {
    std::string v;
    put_bytes(v, 1, tag);
    put_key(v, 2, 5);  // simple_value
    put_fixed(v, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  write_record(event(step, "", summary));
}

void TensorBoardWriter::samples(const SampleRecord& record) {
  std::string summary;
  for (const auto& image : record.images) {
    std::string encoded;  // Summary.Image
    put_key(encoded, 1, 0);
    put_varint(encoded, static_cast<uint64_t>(image.height));
    put_key(encoded, 2, 0);
    put_varint(encoded, static_cast<uint64_t>(image.width));
    put_key(encoded, 3, 0);
    put_varint(encoded, 3);  // colorspace RGB
    put_bytes(encoded, 4, image.png);
    std::string v;
    put_bytes(v, 1, image.tag);
    put_bytes(v, 4, encoded);
    put_bytes(summary, 1, v);
  }
  for (const auto& audio : record.audio) {
    std::string encoded;  // Summary.Audio
    put_key(encoded, 1, 5);
    put_fixed(encoded, static_cast<float>(audio.sample_rate));
    put_key(encoded, 2, 0);
    put_varint(encoded, static_cast<uint64_t>(audio.channels));
    put_key(encoded, 3, 0);
    put_varint(encoded, static_cast<uint64_t>(audio.frames));
    put_bytes(encoded, 4, audio.wav);
    put_bytes(encoded, 5, "audio/wav");
    std::string v;
    put_bytes(v, 1, audio.tag);
    put_bytes(v, 6, encoded);
    put_bytes(summary, 1, v);
  }
  for (const auto& text : record.texts) {
    std::string plugin, metadata, shape, dim, tensor, v;
    put_bytes(plugin, 1, "text");  // PluginData.plugin_name
    put_bytes(metadata, 1, plugin);  // SummaryMetadata.plugin_data
    put_key(dim, 1, 0);
    put_varint(dim, 1);              // TensorShapeProto.Dim.size
    put_bytes(shape, 2, dim);
    put_key(tensor, 1, 0);
    put_varint(tensor, 7);           // DT_STRING
    put_bytes(tensor, 2, shape);
    put_bytes(tensor, 8, text.text);  // string_val
    put_bytes(v, 1, text.tag);
    put_bytes(v, 8, tensor);
    put_bytes(v, 9, metadata);
    put_bytes(summary, 1, v);
  }
  write_record(event(record.iteration, "", summary));
}

void TensorBoardWriter::write_record(const std::string& data) {
  std::string record;
  const uint64_t length = data.size();
  put_fixed(record, length);
  put_fixed(record, masked_crc(record.data(), sizeof length));
  record += data;
  put_fixed(record, masked_crc(data.data(), data.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    fail("logging.tensorboard: cannot write ", path_, ": ", std::strerror(errno));
}

}  // namespace mmtrain
