// A seeded mutation fuzzer over the parsers of files mmtrain did not write itself: a safetensors
// file (header and data), a checkpoint's index.json and trainer_state.json, a YAML config, a
// tekken.json tokenizer, and a torch.save .pt sample (the whole file, and its pickle re-packed into a valid zip so that the
// mutations reach the unpickler rather than stopping at the zip's checksums).
// Each round damages a valid input (bit flips, byte overwrites with JSON/YAML punctuation, cuts,
// duplicated spans, deep bracket runs, huge numbers) and parses it: the only acceptable outcomes
// are success or an mmtrain::Error. Any other exception fails the test; a crash fails the binary.
// Bounded: kRounds per target (about a second each on one core); the count tried is printed.
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint_test_util.h"
#include "core/error.h"
#include "data/magihuman/precomputed_dataset.h"
#include "data/mistral3/fixture.h"
#include "data/tokenizer/text_tokenizer.h"
#include "io/safetensors.h"
#include "multirank_harness.h"
#include "config/config.h"

#include <caffe2/serialize/in_memory_adapter.h>
#include <caffe2/serialize/inline_container.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

constexpr int kRounds = 1500;

std::string mutate(const std::string& input, std::mt19937_64& rng) {
  std::string s = input;
  static const std::string kPunctuation = "{}[]\":,0123456789-eE.&*!|>\n #'\\";
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits && !s.empty(); ++e) {
    const size_t at = rng() % s.size();
    switch (rng() % 7) {
      case 0: s[at] = static_cast<char>(s[at] ^ (1 << (rng() % 8))); break;
      case 1: s[at] = kPunctuation[rng() % kPunctuation.size()]; break;
      case 2: s.erase(at, 1 + rng() % 16); break;
      case 3: s.insert(at, s.substr(rng() % s.size(), 1 + rng() % 32)); break;
      case 4: s.insert(at, std::string(1 + rng() % 300, rng() % 2 ? '[' : '{')); break;
      case 5: s.insert(at, "99999999999999999999"); break;
      case 6: s.resize(at); break;
    }
  }
  return s;
}

// Runs parse on kRounds mutations of input; counts the outcomes.
void fuzz(const char* target, const std::string& input, const std::function<void(const std::string&)>& parse) {
  try {
    parse(input);
  } catch (const std::exception& e) {
    FAIL() << target << ": the undamaged input must parse: " << e.what();
  }
  std::mt19937_64 rng(20261201);
  int accepted = 0, refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto damaged = mutate(input, rng);
    try {
      parse(damaged);
      ++accepted;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << target << " round " << round << ": an exception that is not an mmtrain::Error: " << e.what();
      return;
    }
  }
  std::printf("fuzz %s: %d inputs tried, %d parsed, %d refused with an error, 0 crashes\n", target, kRounds, accepted,
              refused);
  EXPECT_GT(refused, kRounds / 10) << target << ": the mutations should break most inputs";
}

TEST(ParserFuzz, SafetensorsFiles) {
  TempDir dir;
  const std::string path = dir / "a.safetensors";
  safetensors_write(path, {{"w", at::arange(12, at::kFloat).view({3, 4})}, {"b", at::ones({5}, at::kBFloat16)}},
                    {{"format", "pt"}});
  const std::string valid = read_bytes(path);
  const std::string damaged = dir / "b.safetensors";
  fuzz("safetensors file", valid, [&](const std::string& bytes) {
    write_bytes(damaged, bytes);
    SafetensorsFile file(damaged);
    for (const auto& name : file.names()) file.read(name);
  });
}

TEST(ParserFuzz, CheckpointIndexAndTrainerState) {
  TempDir root;
  testing::run_ranks(2, [&](Comm& comm) {
    const int rank = comm.rank();
    std::vector<ShardedTensor> tensors = {
        {"w", {5, 3}, rank == 0 ? 0 : 3, at::ones({rank == 0 ? 3 : 2, 3})},
        {"step", {}, 0, at::scalar_tensor(int64_t{7}, at::kLong)}};
    checkpoint_save(root.str(), 4, comm, tensors, {{"iteration", 4}, {"model_id", "x"}}, {{"rng", "00"}},
                    {{"apply_modules", {"a.{*}"}}});
  });
  const std::string iter_dir = root / "iter_0000004";
  for (const char* file : {"index.json", "trainer_state.json"}) {
    const std::string path = iter_dir + "/" + file;
    const std::string valid = read_bytes(path);
    fuzz(file, valid, [&](const std::string& text) {
      write_bytes(path, text);
      CheckpointReader reader(iter_dir);
      for (const auto& name : reader.names()) reader.read_full(name);
      reader.rank_state(0);
    });
    write_bytes(path, valid);
  }
}

TEST(ParserFuzz, YamlConfigs) {
  const std::string valid = R"(parallel:
  fully_shard_parallel_size: auto
  fsdp_plan:
    apply_modules: ["layers.{*}"]
    param_dtype: bf16
model:
  model_id: test_transformer
  config: {vocab_size: 64, hidden_size: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn_hidden_size: 64}
data:
  dataset_param: {dataset_type: token_file, path: tokens.safetensors}
  dataloader_param: {shuffle: true, num_workers: 2, collate_param: {model_name: causal_lm}}
features:
  recompute: true
  recompute_plan: {apply_modules: &blocks ["layers.{*}"]}
training: {micro_batch_size: 2, lr: 3.0e-4, train_iters: 10, seed: 5}
logging: {output_dir: runs/x}
tools: {profile: {enable: false, ranks: [0]}}
)";
  fuzz("YAML config", valid, [&](const std::string& text) { config_from_yaml_string(text, "fuzz.yaml", {}); });
}

TEST(ParserFuzz, TekkenTokenizer) {
  TempDir dir;
  mistral3::Mistral3DataFixture fixture;
  fixture.samples = 1;
  mistral3::fixture_mistral3_data(dir.str(), fixture);
  const std::string valid = read_bytes(dir / "tekken.json");
  fs::create_directories(dir / "damaged");
  const std::string damaged = (fs::path(dir / "damaged") / "tekken.json").string();
  fuzz("tekken.json", valid, [&](const std::string& text) {
    write_bytes(damaged, text);
    tokenizer::load_text_tokenizer(damaged)->encode("[INST] a b <image>");
  });
}

// The records of a torch zip archive, in order (names without the archive's folder).
std::vector<std::pair<std::string, std::string>> zip_records(const std::string& bytes) {
  caffe2::serialize::PyTorchStreamReader reader(
      std::make_shared<caffe2::serialize::MemoryReadAdapter>(bytes.data(), static_cast<off_t>(bytes.size())));
  std::vector<std::pair<std::string, std::string>> records;
  for (const auto& name : reader.getAllRecords()) {
    auto [data, size] = reader.getRecord(name);
    records.emplace_back(name, std::string(static_cast<const char*>(data.get()), size));
  }
  return records;
}

std::string zip_of(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t n) {
    out.append(static_cast<const char*>(data), n);
    return n;
  });
  for (const auto& [name, data] : records) writer.writeRecord(name, data.data(), data.size());
  writer.writeEndOfFile();
  return out;
}

TEST(ParserFuzz, TorchPtSamples) {
  TempDir dir;
  const std::string path = dir / "a.pt";
  magihuman::write_pt_file(path, {{"latent", at::arange(24, at::kFloat).view({2, 3, 4})},
                                  {"mask", at::ones({3}, at::kBool)},
                                  {"ids", at::arange(5, at::kLong)}});
  const std::string valid = read_bytes(path);
  const std::string damaged = dir / "b.pt";
  auto parse = [&](const std::string& bytes) {
    write_bytes(damaged, bytes);
    magihuman::read_sample_file(damaged);
  };
  fuzz("torch .pt file", valid, parse);

  const auto records = zip_records(valid);
  size_t pickle_at = records.size();
  for (size_t i = 0; i < records.size(); ++i)
    if (records[i].first == "data.pkl") pickle_at = i;
  ASSERT_LT(pickle_at, records.size()) << "no data.pkl in the archive";
  fuzz("torch .pt pickle", records[pickle_at].second, [&](const std::string& pickle) {
    auto repacked = records;
    repacked[pickle_at].second = pickle;
    parse(zip_of(repacked));
  });
}

}  // namespace
}  // namespace mmtrain
