#include "core/pickle_scan.h"

#include "core/error.h"
#include "core/text.h"

#include <cstring>

namespace mmtrain {
namespace {

// Little-endian unsigned integer of n bytes at p.
uint64_t little_endian(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

PickleScan scan_pickle(const char* data, size_t size, const std::string& source) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  PickleScan scan;
  size_t at = 0;
  auto need = [&](size_t n) {
    if (n > size - at) fail(source, ": the pickle is truncated at byte ", at, " of ", size);
  };
  // An argument of fixed width, or a length of `width` bytes followed by that many bytes.
  auto skip = [&](size_t n) {
    need(n);
    at += n;
  };
  auto skip_counted = [&](int width) {
    need(width);
    const uint64_t n = little_endian(p + at, width);
    at += width;
    if (n > size - at) fail(source, ": the pickle is truncated at byte ", at, " of ", size);
    at += n;
  };
  auto skip_line = [&] {
    const void* newline = std::memchr(p + at, '\n', size - at);
    if (!newline) fail(source, ": the pickle is truncated at byte ", at, " of ", size);
    at = static_cast<const unsigned char*>(newline) - p + 1;
  };
  while (at < size) {
    const unsigned char op = p[at++];
    ++scan.opcodes;
    switch (op) {
      case '.': return scan;  // STOP
      case 0x80: skip(1); break;  // PROTO
      case 0x95: skip(8); break;  // FRAME
      case 'c': skip_line(); skip_line(); break;  // GLOBAL module\nname\n
      case 'J': skip(4); break;  // BININT
      case 'K': skip(1); break;  // BININT1
      case 'M': skip(2); break;  // BININT2
      case 'G': skip(8); break;  // BINFLOAT
      case 0x8a: skip_counted(1); break;  // LONG1
      case 0x8b: skip_counted(4); break;  // LONG4
      case 0x8c: case 'U': case 'C': skip_counted(1); break;  // SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES
      case 'X': case 'T': case 'B': skip_counted(4); break;   // BINUNICODE, BINSTRING, BINBYTES
      case 0x8d: case 0x8e: case 0x96: skip_counted(8); break;  // BINUNICODE8, BINBYTES8, BYTEARRAY8
      case 'q': case 'h': skip(1); break;  // BINPUT, BINGET
      case 'r': case 'j': skip(4); break;  // LONG_BINPUT, LONG_BINGET
      case '}': case ']': case ')': case 'd': case 'l': case 't':  // EMPTY_DICT/LIST/TUPLE, DICT, LIST, TUPLE
      case 0x85: case 0x86: case 0x87: case 0x8f: case 0x91:      // TUPLE1-3, EMPTY_SET, FROZENSET
        if (++scan.containers > kMaxPickleContainers)
          fail(source, ": the pickle creates more than ", kMaxPickleContainers,
               " lists, dicts and tuples (a torch.save'd dict of tensors creates a few): refused before unpickling, "
               "as deep nesting crashes LibTorch's unpickler");
        break;
      // No argument: MARK, POP, POP_MARK, DUP, NONE, NEWTRUE, NEWFALSE, APPEND(S), SETITEM(S),
      // ADDITEMS, REDUCE, BUILD, NEWOBJ, NEWOBJ_EX, STACK_GLOBAL, MEMOIZE, BINPERSID, NEXT_BUFFER,
      // READONLY_BUFFER.
      case '(': case '0': case '1': case '2': case 'N': case 0x88: case 0x89: case 'a': case 'e': case 's':
      case 'u': case 0x90: case 'R': case 'b': case 0x81: case 0x92: case 0x93: case 0x94: case 'Q':
      case 0x97: case 0x98:
        break;
      default:
        fail(source, ": pickle opcode ", format("0x%02x", op), " at byte ", at - 1,
             " is not one torch.save writes; refused");
    }
  }
  fail(source, ": the pickle ends without its STOP opcode (truncated)");
}

}  // namespace mmtrain
