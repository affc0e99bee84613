// core/sha256.h against FIPS 180-4's examples and Python's hashlib (a million 'a's; data fed in
// pieces that straddle the 64-byte blocks).
#include "core/sha256.h"

#include <gtest/gtest.h>

#include <string>

namespace mmtrain {
namespace {

std::string sha256_of(const std::string& text, size_t piece) {
  Sha256 hash;
  for (size_t at = 0; at < text.size(); at += piece) hash.update(text.data() + at, std::min(piece, text.size() - at));
  return hash.hex();
}

TEST(Sha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(sha256_of("", 1), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_of("abc", 1), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  for (size_t piece : {1, 7, 56, 64})
    EXPECT_EQ(sha256_of(two_blocks, piece), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_of(std::string(1000000, 'a'), 4096),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

}  // namespace
}  // namespace mmtrain
