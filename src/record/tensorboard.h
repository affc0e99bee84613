// TensorBoard event files, written live from C++: what `tensorboard --logdir` and PyTorch's
// SummaryWriter read. No protobuf library: an Event is three or four fields, encoded here by hand.
//
// File: <dir>/events.out.tfevents.<unix seconds>.<host>.<pid>, a sequence of records
//   uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes | data | uint32 masked CRC-32C of data
// where masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 and data is a serialized tensorflow.Event:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }   Value { string tag = 1; float simple_value = 2; Image image = 4;
//                                                   Audio audio = 6; TensorProto tensor = 8; SummaryMetadata metadata = 9; }
// The first record carries file_version "brain.Event:2"; each step is one Event of scalars,
// flushed at once so that a running TensorBoard shows it.
#pragma once
#include "record/sample_record.h"

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace mmtrain {

class TensorBoardWriter {
 public:
  // Creates dir if needed and a new event file in it (a resumed run adds a file; TensorBoard
  // reads every file of the directory as one run).
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One Event at `step` holding every (tag, value) as a scalar (stored as float32, TensorBoard's type).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // One Event at the record's iteration with its images (Summary.Image, PNG), audio (Summary.Audio,
  // WAV) and texts (the text plugin's string tensor, as SummaryWriter.add_text writes it).
  void samples(const SampleRecord& record);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mmtrain
