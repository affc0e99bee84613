// The check before a file is opened for reading: a directory opens as an empty stream, a FIFO or
// /dev/zero blocks or never ends, and a NUL byte inside the name silently cuts the path the C
// library sees. Each of these is named, instead of surfacing as an empty or missing file.
#pragma once
#include <string>

namespace mmtrain {

// Fails unless `path` names a regular file (or a link to one), with one of
//   "<label>: no such file"
//   "<label>: not a regular file (a directory), expected <expected>"
//   "<label>: not a regular file (a FIFO, device or socket), expected <expected>"
//   "<label up to the NUL>\\0...: the path contains a NUL byte"
// where label is what the caller calls the file ("image /a/b.png", "config x.yaml", a path).
void require_regular_file(const std::string& path, const std::string& label, const std::string& expected);

// A file name read from a file mmtrain did not necessarily write (a checkpoint's index.json, a DCP's
// metadata) must name a file inside that directory: non-empty, no '/', not "." or "..", no NUL.
// Fails with "<where>: refused: <what> is '<name>', which is not a plain file name inside <dir>".
void require_plain_file_name(const std::string& name, const std::string& where, const std::string& what,
                             const std::string& dir);

}  // namespace mmtrain
