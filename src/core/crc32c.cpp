#include "core/crc32c.h"

#include <array>
#include <cstdio>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace mmtrain {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // Castagnoli, bit-reversed

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

// The state here is the inverted CRC (~crc), as both the instruction and the table work on it.
uint32_t update_table(uint32_t state, const uint8_t* p, size_t n) {
  static const auto table = make_table();
  for (size_t i = 0; i < n; ++i) state = table[(state ^ p[i]) & 0xff] ^ (state >> 8);
  return state;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t update_sse42(uint32_t state, const uint8_t* p, size_t n) {
  uint64_t s = state;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    s = _mm_crc32_u64(s, word);
  }
  auto s32 = static_cast<uint32_t>(s);
  for (; n > 0; --n, ++p) s32 = _mm_crc32_u8(s32, *p);
  return s32;
}

bool has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t state = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~update_sse42(state, p, size);
#endif
  return ~update_table(state, p, size);
}

uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc) {
  return ~update_table(~crc, static_cast<const uint8_t*>(data), size);
}

std::string crc32c_hex(uint32_t crc) {
  char buf[9];
  std::snprintf(buf, sizeof(buf), "%08x", crc);
  return buf;
}

}  // namespace mmtrain
