// io/atomic_file.h: buffered and direct-I/O writes of lengths around the 4096-byte alignment and
// the 8 MiB bounce buffer, in odd-sized pieces, read back byte for byte at their exact length.
#include "checkpoint/checkpoint_test_util.h"
#include "io/atomic_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace mmtrain {
namespace {

using testing::read_bytes;
using testing::TempDir;

std::string pattern(size_t n) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  return bytes;
}

// Whether this directory's filesystem takes O_DIRECT (tmpfs does not).
bool supports_direct(const std::string& dir) {
  const std::string probe = dir + "/probe";
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_DIRECT, 0644);
  if (fd < 0) return false;
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

TEST(AtomicFile, DirectAndBufferedWritesReadBackAtTheirExactLength) {
  TempDir dir;
  const size_t mib8 = size_t{8} << 20;
  for (auto direct : {AtomicFile::Direct::no, AtomicFile::Direct::when_supported}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097}, mib8, mib8 + 4097, 2 * mib8 + 1}) {
      SCOPED_TRACE(std::to_string(n) + " bytes, direct " + std::to_string(direct == AtomicFile::Direct::when_supported));
      const std::string path =
          dir / ((direct == AtomicFile::Direct::no ? "buffered_" : "direct_") + std::to_string(n));
      const std::string bytes = pattern(n);
      AtomicFile file(path, direct);
      EXPECT_EQ(file.direct(), direct == AtomicFile::Direct::when_supported && supports_direct(dir.str()));
      for (size_t at = 0, piece = 1; at < n; at += piece, piece = piece * 3 + 1)  // 1, 4, 13, ... bytes
        file.write(bytes.data() + at, std::min(piece, n - at));
      EXPECT_FALSE(std::filesystem::exists(path));  // only the .tmp until commit
      file.commit();
      EXPECT_EQ(std::filesystem::file_size(path), n);
      EXPECT_TRUE(read_bytes(path) == bytes);
      EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
    }
  }
}

}  // namespace
}  // namespace mmtrain
