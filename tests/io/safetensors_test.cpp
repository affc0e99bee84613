// safetensors.h: round trips for every dtype and shape kind, row reads that touch only their rows,
// byte-exact and reproducible output, and one clear error (naming the file) per kind of corruption.
// SafetensorsInterop.* is driven by tests/parity/test_safetensors_interop.py.
#include "checkpoint/checkpoint_test_util.h"
#include "checkpoint/sharded_checkpoint.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "multirank_harness.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

namespace mmtrain {
namespace {

using testing::bitwise_equal;
using testing::random_tensor;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

const std::vector<at::ScalarType> kAllDtypes = {
    at::kBool,  at::kByte,   at::kChar,          at::kShort,         at::kUInt16,          at::kHalf,
    at::kBFloat16, at::kInt, at::kUInt32,        at::kFloat,         at::kDouble,          at::kLong,
    at::kUInt64, at::kComplexFloat, at::kFloat8_e4m3fn, at::kFloat8_e5m2, at::kFloat8_e4m3fnuz,
    at::kFloat8_e5m2fnuz};

// A file from a header string and data bytes, exactly as given (for corruption cases).
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  write_bytes(path, std::string(reinterpret_cast<const char*>(&n), 8) + header + data);
}

TEST(Safetensors, RoundTripsEveryDtypeAndShapeKind) {
  TempDir dir;
  const std::vector<std::vector<int64_t>> shapes = {{3, 5}, {}, {0, 4}, {7}, {2, 0, 3}};
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  uint64_t seed = 1;
  for (auto dtype : kAllDtypes)
    for (size_t i = 0; i < shapes.size(); ++i)
      tensors.emplace_back(safetensors_dtype_name(dtype) + "/" + std::to_string(i),
                           random_tensor(shapes[i], dtype, seed++));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "{\"json\": [1, 2]} é"}};
  const std::string path = dir / "all.safetensors";
  safetensors_write(path, tensors, metadata);

  SafetensorsFile file(path);
  ASSERT_EQ(file.names().size(), tensors.size());
  EXPECT_EQ(file.metadata(), metadata);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, expected] = tensors[i];
    EXPECT_EQ(file.names()[i], name) << "names() must be in file order";
    ASSERT_TRUE(file.contains(name));
    EXPECT_EQ(file.info(name).dtype, expected.scalar_type()) << name;
    EXPECT_EQ(file.info(name).shape, expected.sizes().vec()) << name;
    EXPECT_TRUE(bitwise_equal(file.read(name), expected)) << name;
  }
  EXPECT_EQ(safetensors_dtype_parse("BF16"), at::kBFloat16);
  EXPECT_FALSE(safetensors_dtype_parse("F12").has_value());
}

TEST(Safetensors, ReadRowsReadsOnlyTheRowsAsked) {
  TempDir dir;
  const std::string path = dir / "rows.safetensors";
  auto first = random_tensor({4}, at::kFloat, 1);
  auto big = at::arange(6 * 3 * 2, at::kFloat).view({6, 3, 2});
  auto scalar = at::scalar_tensor(7, at::kLong);
  safetensors_write(path, {{"first", first}, {"scalar", scalar}, {"big", big}});

  SafetensorsFile file(path);
  EXPECT_TRUE(bitwise_equal(file.read_rows("big", 1, 4), big.slice(0, 1, 4).contiguous()));
  EXPECT_TRUE(bitwise_equal(file.read_rows("big", 5, 6), big.slice(0, 5, 6).contiguous()));
  EXPECT_EQ(file.read_rows("big", 3, 3).sizes(), (std::vector<int64_t>{0, 3, 2}));
  EXPECT_TRUE(bitwise_equal(file.read_rows("first", 0, 4), first));
  EXPECT_THROW_WITH(file.read_rows("big", 4, 7), path, "'big'", "[4, 7)", "6 rows");
  EXPECT_THROW_WITH(file.read_rows("big", -1, 2), path, "'big'");
  EXPECT_THROW_WITH(file.read_rows("big", 3, 2), path, "'big'");
  EXPECT_THROW_WITH(file.read_rows("scalar", 0, 1), path, "'scalar'", "0-dim");
  auto wrong_out = at::empty({2, 3, 2}, at::kDouble);
  EXPECT_THROW_WITH(file.read_rows_into("big", 0, 2, wrong_out), path, "'big'", "Double");

  // Cut the file (already open) right after row 2 of "big": rows 0-2 still read, anything past
  // them must fail. So read_rows fetches its rows and nothing beyond them.
  const auto& info = file.info("big");
  const int64_t row_bytes = 3 * 2 * 4;
  const int64_t data_start = static_cast<int64_t>(std::filesystem::file_size(path)) - info.data_end;
  std::filesystem::resize_file(path, data_start + info.data_begin + 3 * row_bytes);
  EXPECT_TRUE(bitwise_equal(file.read_rows("big", 0, 3), big.slice(0, 0, 3).contiguous()));
  EXPECT_TRUE(bitwise_equal(file.read("scalar"), scalar));
  EXPECT_THROW_WITH(file.read_rows("big", 2, 4), path, "'big'", "end of file");
  EXPECT_THROW_WITH(file.read("big"), path, "'big'", "end of file");
}

TEST(Safetensors, WritesAreByteReproducibleAndLaidOutAsTheReferenceWriter) {
  TempDir dir;
  // The same four tensors Python's safetensors.torch.save_file(..., metadata={"format": "pt"})
  // lays out in this order; its header bytes are copied here verbatim.
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"d", at::zeros({}, at::kLong)},
      {"a", at::zeros({3}, at::kFloat)},
      {"c", at::zeros({0, 2}, at::kFloat)},
      {"b", at::zeros({2}, at::kBFloat16)}};
  const std::string expected_header =
      R"({"__metadata__":{"format":"pt"},"d":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[3],"data_offsets":[8,20]},"c":{"dtype":"F32","shape":[0,2],)"
      R"("data_offsets":[20,20]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[20,24]}}     )";
  safetensors_write(dir / "one.safetensors", tensors, {{"format", "pt"}});
  const std::string bytes = read_bytes(dir / "one.safetensors");
  ASSERT_EQ(bytes.size(), 8 + expected_header.size() + 24);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len, 256u);
  EXPECT_EQ(bytes.substr(8, header_len), expected_header);
  EXPECT_EQ(bytes.substr(8 + header_len), std::string(24, '\0'));

  // Same inputs, same bytes; a non-contiguous view writes what its contiguous copy writes.
  auto base = random_tensor({4, 6}, at::kBFloat16, 3);
  safetensors_write(dir / "x1.safetensors", {{"t", base.t()}, {"u", base}}, {{"k", "v"}});
  safetensors_write(dir / "x2.safetensors", {{"t", base.t().contiguous()}, {"u", base.clone()}}, {{"k", "v"}});
  EXPECT_EQ(read_bytes(dir / "x1.safetensors"), read_bytes(dir / "x2.safetensors"));
  EXPECT_TRUE(bitwise_equal(SafetensorsFile(dir / "x1.safetensors").read("t"), base.t().contiguous()));
  auto complex = random_tensor({3}, at::kComplexFloat, 4);
  safetensors_write(dir / "conj.safetensors", {{"c", complex.conj()}});
  EXPECT_TRUE(bitwise_equal(SafetensorsFile(dir / "conj.safetensors").read("c"), complex.conj().resolve_conj()));
  // No file without metadata gets an empty "__metadata__"; no .tmp file is left behind.
  safetensors_write(dir / "nometa.safetensors", {{"t", base}});
  EXPECT_EQ(read_bytes(dir / "nometa.safetensors").find("__metadata__"), std::string::npos);
  for (const auto& entry : std::filesystem::directory_iterator(dir.str()))
    EXPECT_EQ(entry.path().extension(), ".safetensors") << entry.path();
}

TEST(Safetensors, WriteRejectsBadInput) {
  TempDir dir;
  const std::string path = dir / "bad.safetensors";
  auto t = at::zeros({2});
  EXPECT_THROW_WITH(safetensors_write(path, {{"a", t}, {"a", t}}), path, "'a'", "twice");
  EXPECT_THROW_WITH(safetensors_write(path, {{"__metadata__", t}}), path, "reserved");
  EXPECT_THROW_WITH(safetensors_write(path, {{"z", at::zeros({2}, at::kComplexDouble)}}), "ComplexDouble");
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Safetensors, EachCorruptionGivesAClearErrorNamingTheFile) {
  TempDir dir;
  const std::string good = dir / "good.safetensors";
  safetensors_write(good, {{"weight", random_tensor({4, 4}, at::kFloat, 1)}, {"bias", random_tensor({4}, at::kFloat, 2)}});
  const std::string bytes = read_bytes(good);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);

  const std::string cut4 = dir / "cut4.safetensors";
  write_bytes(cut4, bytes.substr(0, 4));
  EXPECT_THROW_WITH(SafetensorsFile{cut4}, cut4, "at least 8 bytes", "found 4");

  const std::string cut_header = dir / "cut_header.safetensors";
  write_bytes(cut_header, bytes.substr(0, header_len + 8 - 1));
  EXPECT_THROW_WITH(SafetensorsFile{cut_header}, cut_header, "header length", "past the end");

  const std::string cut_data = dir / "cut_data.safetensors";  // last tensor loses its last byte
  write_bytes(cut_data, bytes.substr(0, bytes.size() - 1));
  EXPECT_THROW_WITH(SafetensorsFile{cut_data}, cut_data, "'bias'", "out of range");

  const std::string missing = dir / "missing.safetensors";
  EXPECT_THROW_WITH(SafetensorsFile{missing}, missing, "no such file");
  EXPECT_THROW_WITH(SafetensorsFile{dir.str()}, dir.str(), "not a regular file");

  const std::string data(80, '\0');
  struct Case {
    std::string name, header, data;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"bad_json", R"({"weight": {"dtype": "F32", )", data, {"not valid JSON"}},
      {"not_object", R"([1, 2])", data, {"expected an object"}},
      // Nested 60k levels deep: once a stack overflow in the error path.
      {"deep", "{\"w\": " + std::string(60000, '[') + std::string(60000, ']') + "}", data, {"nested more than 128"}},
      {"unknown_dtype", R"({"weight":{"dtype":"F12","shape":[4,4],"data_offsets":[0,64]}})", data.substr(0, 64),
       {"'weight'", "unknown dtype", "F12"}},
      {"missing_field", R"({"weight":{"dtype":"F32","shape":[4,4]}})", data, {"'weight'", "data_offsets"}},
      {"negative_dim", R"({"weight":{"dtype":"F32","shape":[-4,4],"data_offsets":[0,64]}})", data.substr(0, 64),
       {"'weight'", "non-negative"}},
      {"offsets_past_end", R"({"weight":{"dtype":"F32","shape":[4,4],"data_offsets":[16,1000]}})", data,
       {"'weight'", "out of range", "80 bytes"}},
      {"offsets_reversed", R"({"weight":{"dtype":"F32","shape":[4,4],"data_offsets":[64,0]}})", data,
       {"'weight'", "out of range"}},
      {"offsets_vs_shape", R"({"weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,60]}})", data.substr(0, 60),
       {"'weight'", "60 bytes", "needs 64 bytes"}},
      {"overflowing_shape",
       R"({"weight":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,64]}})", data.substr(0, 64),
       {"'weight'", "2^63"}},
      {"overlap",
       R"({"weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]},"bias":{"dtype":"F32","shape":[4],"data_offsets":[48,64]}})",
       data.substr(0, 64), {"'bias'", "overlap", "'weight'"}},
      {"gap",
       R"({"weight":{"dtype":"F32","shape":[4,4],"data_offsets":[16,80]},"bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       data, {"gap", "[8, 16)", "'weight'"}},
      {"trailing_bytes", R"({"weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,64]}})", data,
       {"80 bytes", "cover 64", "trailing"}},
      {"metadata_not_strings", R"({"__metadata__":{"step":3}})", "", {"__metadata__", "'step'", "string"}},
      // Issue 55, item 6: the header is parsed without a DOM; what a DOM took silently is named.
      {"duplicate", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
       "", {"'w'", "given twice"}},
      {"entry_not_object", R"({"w":5})", "", {"'w' must be an object"}},
      {"float_dim", R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data.substr(0, 8),
       {"'w'", "shape must be an array of non-negative integers", "2.0"}},
      {"three_offsets", R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", data.substr(0, 8),
       {"'w'", "data_offsets must be [begin, end]"}},
      {"huge_number", R"({"w":{"dtype":"F32","shape":[1e400],"data_offsets":[0,8]}})", data.substr(0, 8),
       {"not valid JSON"}},
  };
  for (const auto& c : cases) {
    const std::string path = dir / (c.name + ".safetensors");
    write_raw(path, c.header, c.data);
    std::vector<std::string> expected = c.message;
    expected.push_back(path);
    try {
      SafetensorsFile file(path);
      ADD_FAILURE() << c.name << ": opened without error";
    } catch (const Error& e) {
      for (const auto& part : expected)
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
            << c.name << ": message lacks '" << part << "': " << e.what();
    }
  }

  SafetensorsFile file(good);
  EXPECT_THROW_WITH(file.info("nope"), good, "'nope'");
  EXPECT_THROW_WITH(file.read("nope"), good, "'nope'");
}

// Issue 55, item 6: a header over the reference reader's 100,000,000-byte cap is refused before
// a byte of it is allocated (the file is sparse: nothing was written); unknown fields of an entry
// are skipped whole, as the reference reader skips them.
TEST(Safetensors, AHeaderOverTheCapIsRefusedUnreadAndUnknownFieldsAreSkipped) {
  TempDir dir;
  const std::string big = dir / "big.safetensors";
  {
    const uint64_t n = 100'000'008;
    std::ofstream(big, std::ios::binary).write(reinterpret_cast<const char*>(&n), 8);
    std::filesystem::resize_file(big, 8 + n);
  }
  EXPECT_THROW_WITH(SafetensorsFile{big}, big, "header length 100000008 bytes, over the 100000000");
  const std::string extra = dir / "extra.safetensors";
  write_raw(extra, R"({"w":{"dtype":"F32","note":{"a":[1,{"b":2}]},"shape":[2],"x":null,"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  const SafetensorsFile file(extra);
  EXPECT_EQ(file.info("w").shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(file.info("w").data_end, 8);
}

TEST(SafetensorsIndex, ReadsShardedAndSingleFileDirectories) {
  TempDir dir;
  auto a = random_tensor({3, 2}, at::kBFloat16, 1), b = random_tensor({5}, at::kFloat, 2);
  auto c = random_tensor({2, 2}, at::kLong, 3);
  safetensors_write(dir / "model-00001-of-00002.safetensors", {{"b", b}, {"a", a}}, {{"format", "pt"}});
  safetensors_write(dir / "model-00002-of-00002.safetensors", {{"c", c}}, {{"format", "pt"}});
  const std::vector<std::pair<std::string, std::string>> weight_map = {
      {"a", "model-00001-of-00002.safetensors"},
      {"b", "model-00001-of-00002.safetensors"},
      {"c", "model-00002-of-00002.safetensors"}};
  safetensors_index_write(dir / "model.safetensors.index.json", {{"total_size", 64}}, weight_map);
  // What Python's json.dumps(index, indent=2) + "\n" writes (HF's save_pretrained also sorts keys).
  EXPECT_EQ(read_bytes(dir / "model.safetensors.index.json"),
            "{\n  \"metadata\": {\n    \"total_size\": 64\n  },\n  \"weight_map\": {\n"
            "    \"a\": \"model-00001-of-00002.safetensors\",\n    \"b\": \"model-00001-of-00002.safetensors\",\n"
            "    \"c\": \"model-00002-of-00002.safetensors\"\n  }\n}\n");

  SafetensorsIndex index(dir.str());
  EXPECT_TRUE(index.sharded());
  EXPECT_EQ(index.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(index.file_names(),
            (std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}));
  EXPECT_EQ(index.metadata()["total_size"], 64);
  EXPECT_EQ(index.file_name("c"), "model-00002-of-00002.safetensors");
  EXPECT_TRUE(bitwise_equal(index.read("a"), a));
  EXPECT_TRUE(bitwise_equal(index.read("b"), b));
  EXPECT_TRUE(bitwise_equal(index.read_rows("c", 1, 2), c.slice(0, 1, 2).contiguous()));
  EXPECT_EQ(index.info("a").dtype, at::kBFloat16);
  EXPECT_THROW_WITH(index.read("d"), dir.str(), "'d'");

  TempDir single;
  safetensors_write(single / "model.safetensors", {{"z", c}, {"y", b}});
  SafetensorsIndex single_index(single.str());
  EXPECT_FALSE(single_index.sharded());
  EXPECT_EQ(single_index.names(), (std::vector<std::string>{"z", "y"}));
  EXPECT_TRUE(bitwise_equal(single_index.read("y"), b));

  // A weight map naming a tensor its shard lacks, or a shard that is not there.
  TempDir broken;
  safetensors_write(broken / "model-00001-of-00001.safetensors", {{"a", a}});
  safetensors_index_write(broken / "model.safetensors.index.json", {},
                          {{"a", "model-00001-of-00001.safetensors"}, {"b", "model-00001-of-00001.safetensors"}});
  EXPECT_THROW_WITH(SafetensorsIndex{broken.str()}, "model-00001-of-00001.safetensors", "'b'");
  safetensors_index_write(broken / "model.safetensors.index.json", {}, {{"a", "model-00009-of-00009.safetensors"}});
  EXPECT_THROW_WITH(SafetensorsIndex{broken.str()}, "model-00009-of-00009.safetensors", "no such file");
  TempDir empty;
  EXPECT_THROW_WITH(SafetensorsIndex{empty.str()}, empty.str(), "model.safetensors.index.json", "model.safetensors");
}

// Driven by tests/parity/test_safetensors_interop.py, which sets MMTRAIN_INTEROP_DIR: every
// *.safetensors file Python wrote there is read and written back as <stem>.roundtrip.safetensors
// (same tensor order, same metadata), and a 2-rank checkpoint is saved under ckpt/ for Python to open.
TEST(SafetensorsInterop, RoundTripsPythonFilesAndSavesACheckpoint) {
  const char* env = std::getenv("MMTRAIN_INTEROP_DIR");
  if (!env) GTEST_SKIP() << "MMTRAIN_INTEROP_DIR is not set: tests/parity/test_safetensors_interop.py drives this";
  namespace fs = std::filesystem;
  const fs::path dir(env);
  std::vector<fs::path> inputs;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".safetensors" && name.find(".roundtrip.") == std::string::npos)
      inputs.push_back(entry.path());
  }
  ASSERT_FALSE(inputs.empty()) << "no *.safetensors files in " << dir;
  for (const auto& input : inputs) {
    SafetensorsFile file(input.string());
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& name : file.names()) tensors.emplace_back(name, file.read(name));
    safetensors_write((dir / (input.stem().string() + ".roundtrip.safetensors")).string(), tensors, file.metadata());
  }

  // w[i, j] = 10 i + j (fp32, 5 x 3) over torch.chunk shards, emb = arange (bf16, 7 x 2), step = 42.
  testing::run_ranks(2, [&](Comm& comm) {
    auto w = (at::arange(5, at::kFloat).view({5, 1}) * 10 + at::arange(3, at::kFloat)).contiguous();
    auto emb = at::arange(14, at::kFloat).view({7, 2}).to(at::kBFloat16);
    std::vector<ShardedTensor> shards;
    for (auto [name, full] : std::vector<std::pair<std::string, at::Tensor>>{{"w", w}, {"emb", emb}}) {
      auto [b, e] = testing::chunk_rows(full.size(0), comm.world_size(), comm.rank());
      shards.push_back({name, full.sizes().vec(), b, full.slice(0, b, e)});
    }
    shards.push_back({"step", {}, 0, at::scalar_tensor(42, at::kLong)});
    checkpoint_save((dir / "ckpt").string(), 7, comm, shards, {{"consumed_samples", 70}},
                    {{"rank", comm.rank()}, {"rng", {1, 2, comm.rank()}}}, {{"fsdp", "chunk"}});
  });
}

}  // namespace
}  // namespace mmtrain
