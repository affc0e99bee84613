// Helpers shared by the checkpoint tests: a scratch directory that cleans up after itself, random
// tensors of any dtype (built from random bytes, so NaN payloads and odd dtypes are covered) and a
// bit-for-bit comparison that works for dtypes with almost no kernels (uint16, float8).
#pragma once
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain::testing {

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("mmtrain_ckpt_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Random contents of any dtype: random bytes reinterpreted (bool gets 0/1 bytes only).
inline at::Tensor random_tensor(const std::vector<int64_t>& shape, at::ScalarType dtype, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  if (numel == 0) return at::empty(shape, at::TensorOptions().dtype(dtype));
  if (dtype == at::kBool) return at::randint(0, 2, shape, gen, at::kLong).to(at::kBool);
  const int64_t itemsize = static_cast<int64_t>(c10::elementSize(dtype));
  auto bytes = at::randint(0, 256, {numel * itemsize}, gen, at::kLong).to(at::kByte);
  return bytes.view(dtype).view(shape);
}

// Same dtype, same shape, same bytes (NaN == NaN here, unlike at::equal).
inline ::testing::AssertionResult bitwise_equal(const at::Tensor& actual, const at::Tensor& expected) {
  if (actual.scalar_type() != expected.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << actual.scalar_type() << ", expected " << expected.scalar_type();
  if (actual.sizes() != expected.sizes())
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << ", expected " << expected.sizes();
  if (!actual.is_contiguous() || !expected.is_contiguous())
    return ::testing::AssertionFailure() << "bitwise_equal needs contiguous tensors";
  const size_t nbytes = static_cast<size_t>(actual.numel()) * actual.element_size();
  if (nbytes && std::memcmp(actual.data_ptr(), expected.data_ptr(), nbytes) != 0) {
    const auto* a = static_cast<const unsigned char*>(actual.data_ptr());
    const auto* e = static_cast<const unsigned char*>(expected.data_ptr());
    size_t i = 0;
    while (a[i] == e[i]) ++i;
    return ::testing::AssertionFailure() << "first differing byte " << i << " of " << nbytes << ": "
                                         << int(a[i]) << " vs expected " << int(e[i]);
  }
  return ::testing::AssertionSuccess();
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// torch.chunk's split of dim0 rows over world ranks: ceil(dim0 / world) rows each, the last ranks
// short or empty. Returns [begin, end) of `rank`.
inline std::pair<int64_t, int64_t> chunk_rows(int64_t dim0, int world, int rank) {
  const int64_t chunk = (dim0 + world - 1) / world;
  return {std::min(rank * chunk, dim0), std::min((rank + 1) * chunk, dim0)};
}

// EXPECT that `statement` throws an exception whose message contains every one of `parts`.
#define EXPECT_THROW_WITH(statement, ...)                                                      \
  do {                                                                                         \
    try {                                                                                      \
      statement;                                                                               \
      ADD_FAILURE() << "expected an exception from: " #statement;                              \
    } catch (const std::exception& e) {                                                        \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__})                    \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)                        \
            << "message lacks '" << part << "': " << e.what();                                 \
    }                                                                                          \
  } while (0)

}  // namespace mmtrain::testing
