// The pickle scan: what torch.save writes passes with its few containers; deep nesting (which
// crashed LibTorch's unpickler), unknown opcodes and truncation are refused, naming the source.
#include "core/pickle_scan.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <string>

namespace mmtrain {
namespace {

using namespace std::string_literals;  // "..."s keeps the NUL bytes of pickle arguments

// PROTO 2, {"a": [[[...]]] with `depth` lists}, STOP.
std::string nested_lists(int depth) {
  std::string p = "\x80\x02}";
  p += "\x8c\x01" "a";
  for (int i = 0; i < depth; ++i) p += ']';
  for (int i = 1; i < depth; ++i) p += 'a';  // APPEND each list into the one below it
  p += "s.";
  return p;
}

TEST(PickleScan, CountsContainersAndSkipsArguments) {
  // {"w": (1, 2.5, "x" * 300, b"..", True)} with memo puts, as protocol 2 writes it.
  std::string p = "\x80\x02}q\x00"s;
  p += "X\x01\x00\x00\x00w"s;                       // BINUNICODE "w"
  p += "(K\x01G\x40\x04\x00\x00\x00\x00\x00\x00"s;  // MARK, BININT1 1, BINFLOAT 2.5
  p += "X\x2c\x01\x00\x00"s + std::string(300, ']');  // BINUNICODE: a 300-byte string of ']'
  p += "C\x02\x28\x5d";                            // SHORT_BINBYTES "(]"
  p += "\x88tq\x01s.";                             // NEWTRUE, TUPLE, BINPUT 1, SETITEM, STOP
  const auto scan = scan_pickle(p.data(), p.size(), "t.pt");
  EXPECT_EQ(scan.containers, 2);  // the dict and the tuple: the brackets inside arguments do not count
  EXPECT_EQ(scan_pickle(nested_lists(100).data(), nested_lists(100).size(), "t.pt").containers, 101);
}

TEST(PickleScan, DeepNestingUnknownOpcodesAndTruncationAreRefused) {
  const auto deep = nested_lists(300000);  // what crashed LibTorch's list destructor
  const auto message = testing::error_of([&] { scan_pickle(deep.data(), deep.size(), "sample.pt: data.pkl"); });
  EXPECT_CONTAINS(message, "sample.pt: data.pkl");
  EXPECT_CONTAINS(message, "more than 10000 lists, dicts and tuples");
  const std::string unknown = "\x80\x02\xff.";
  EXPECT_CONTAINS(testing::error_of([&] { scan_pickle(unknown.data(), unknown.size(), "u"); }), "opcode 0xff at byte 2");
  const std::string cut = "\x80\x02X\x10\x00\x00\x00"s + "abc";
  EXPECT_CONTAINS(testing::error_of([&] { scan_pickle(cut.data(), cut.size(), "c"); }), "truncated");
  const std::string no_stop = "\x80\x02}";
  EXPECT_CONTAINS(testing::error_of([&] { scan_pickle(no_stop.data(), no_stop.size(), "n"); }), "without its STOP");
}

}  // namespace
}  // namespace mmtrain
