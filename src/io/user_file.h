// The two owners of files that cross mmtrain's boundary.
//
// Reading a file a user (or another program) named: read_user_file opens it without blocking (a
// FIFO's open never waits for a writer), checks on the opened descriptor that it is a regular
// file (a directory, FIFO, device or socket is named, never read: /dev/zero would read until
// memory ran out), and refuses a file larger than the cap its kind allows, before reading it.
//
// Creating a file in a directory mmtrain does not own exclusively (an output_dir, a --out path):
// write_file_no_follow refuses a symlink at the path (dangling or not: it would write where the
// link points) and anything but a regular file, writes a temporary file of its own in the same
// directory (created O_EXCL | O_NOFOLLOW, so nothing is written through a link planted there),
// and renames it over the path. open_append_no_follow opens a log file for appending the same way.
#pragma once
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace mmtrain {

// Caps per kind of file (bytes). A file over its cap is an error naming the file, its size and
// the cap, read first never.
constexpr int64_t kMaxConfigFileBytes = int64_t{16} << 20;    // YAML configs, --set-file
constexpr int64_t kMaxSmallJsonBytes = int64_t{16} << 20;     // device profiles, plan.json, indexes
constexpr int64_t kMaxTextFileBytes = int64_t{4} << 30;       // whole-file text reads (conversations)
constexpr int64_t kMaxDataFileBytes = int64_t{16} << 30;      // one sample's .pt file, read whole
constexpr int64_t kMaxImageFileBytes = int64_t{256} << 20;    // one encoded image

// The whole file; label names it in errors ("device profile /a/b.json"). Fails with
//   "<label>: no such file" | "<label>: not a regular file (a directory|a FIFO, device or
//   socket)" | "<label>: N bytes, over the M bytes a <kind> may hold" | "<label>: cannot be read: ..."
std::string read_user_file(const std::string& path, const std::string& label, int64_t max_bytes);

// A file a run keeps in its own directory, which others can write (metrics.jsonl in output_dir):
// read as read_user_file does, but a symlink at the path is refused too, and no file is nullopt.
std::optional<std::string> read_run_file(const std::string& path, const std::string& label, int64_t max_bytes);

// "" when path is absent or a real directory; else what it is instead ("a symbolic link", ...): a
// directory the run writes into is never reached through a link.
std::string not_a_directory(const std::string& path);

// Writes content to path as described above; label names the file in errors ("plan.json").
void write_file_no_follow(const std::string& path, const std::string& content, const std::string& label);

// Opens path for appending (creating it), refusing a symlink or a non-regular file; label as above.
std::FILE* open_append_no_follow(const std::string& path, const std::string& label, bool binary = false);

// Creates path as a new regular file (O_CREAT | O_EXCL | O_NOFOLLOW: never through a link, never
// over an existing file) and returns its descriptor, or -1 with errno set.
int create_new_file(const std::string& path);

}  // namespace mmtrain
