// CRC-32C against the published check values (RFC 3720 B.4 and the "123456789" check) and the
// hardware path against the table on every length and alignment.
#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace mmtrain {
namespace {

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<uint8_t> data(32, 0);
  EXPECT_EQ(crc32c(data.data(), 32), 0x8a9136aau);
  std::fill(data.begin(), data.end(), 0xff);
  EXPECT_EQ(crc32c(data.data(), 32), 0x62a8ab43u);
  for (int i = 0; i < 32; ++i) data[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(data.data(), 32), 0x46dd794eu);
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c_hex(0xe3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x0000abcdu), "0000abcd");
}

TEST(Crc32c, FastPathEqualsTheTableAndExtends) {
  std::mt19937 rng(7);
  std::vector<uint8_t> data(1000);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < 9; ++offset)
    for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 500, 991}) {
      if (offset + n > data.size()) continue;
      EXPECT_EQ(crc32c(data.data() + offset, n), crc32c_portable(data.data() + offset, n)) << offset << " " << n;
    }
  // The CRC of a + b continues from the CRC of a.
  EXPECT_EQ(crc32c(data.data() + 300, 700, crc32c(data.data(), 300)), crc32c(data.data(), 1000));
  // One flipped bit changes it.
  auto flipped = data;
  flipped[500] ^= 0x10;
  EXPECT_NE(crc32c(flipped.data(), 1000), crc32c(data.data(), 1000));
}

}  // namespace
}  // namespace mmtrain
