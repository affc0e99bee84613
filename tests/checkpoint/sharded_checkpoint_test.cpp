// sharded_checkpoint.h on thread-per-rank Gloo worlds: uneven torch.chunk shards saved on 2 and 4
// ranks read back bit for bit on 1-4 ranks, `latest` moves only on complete saves, a crash mid-save
// leaves the previous checkpoint loadable, and bad input fails every rank instead of hanging them.
#include "checkpoint/sharded_checkpoint.h"
#include "checkpoint_test_util.h"
#include "toy_checkpoint.h"
#include "core/error.h"
#include "multirank_harness.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>

namespace mmtrain {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
using testing::chunk_rows;
using testing::expect_reads_back;
using testing::model_tensors;
using testing::rank_state_of;
using testing::save_model;
using testing::random_tensor;
using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

class ShardedCheckpointSave : public ::testing::TestWithParam<int> {};

TEST_P(ShardedCheckpointSave, ReadsBackBitForBitOnAnyWorldSize) {
  const int save_world = GetParam();
  TempDir root;
  std::string saved_dir;
  std::mutex mutex;
  testing::run_ranks(save_world, [&](Comm& comm) {
    auto dir = save_model(root.str(), 10, comm, 100);
    std::lock_guard<std::mutex> lock(mutex);
    if (comm.rank() == 0) saved_dir = dir;
  });
  EXPECT_EQ(saved_dir, root / "iter_0000010");
  EXPECT_EQ(read_bytes(root / "latest"), "iter_0000010\n");
  std::vector<std::string> listing;
  for (const auto& entry : fs::directory_iterator(root.str())) listing.push_back(entry.path().filename().string());
  std::sort(listing.begin(), listing.end());
  EXPECT_EQ(listing, (std::vector<std::string>{"iter_0000010", "latest"})) << "no tmp leftovers";
  for (int r = 0; r < save_world; ++r) {
    char name[64];
    std::snprintf(name, sizeof(name), "iter_0000010/rank_%05d.safetensors", r);
    EXPECT_TRUE(fs::exists(root / name)) << name;
  }
  EXPECT_TRUE(fs::exists(root / "iter_0000010/index.json"));
  EXPECT_TRUE(fs::exists(root / "iter_0000010/trainer_state.json"));

  CheckpointReader reader(root.str());
  EXPECT_EQ(reader.dir(), root / "iter_0000010");
  EXPECT_EQ(reader.iteration(), 10);
  EXPECT_EQ(reader.saved_world_size(), save_world);
  EXPECT_EQ(reader.global_state(), (nlohmann::json{{"iteration", 10}, {"consumed_samples", 80}}));
  EXPECT_EQ(reader.plan(), (nlohmann::json{{"unit", "layers.{*}"}, {"world_size", save_world}}));
  for (int r = 0; r < save_world; ++r) EXPECT_EQ(reader.rank_state(r), rank_state_of(r, 10)) << "rank " << r;
  std::vector<std::string> expected_names;
  for (const auto& [name, t] : model_tensors(100)) expected_names.push_back(name);
  EXPECT_EQ(reader.names(), expected_names);

  // Each rank file is a plain safetensors file holding exactly that rank's rows.
  SafetensorsFile last(root / ("iter_0000010/rank_0000" + std::to_string(save_world - 1) + ".safetensors"));
  EXPECT_EQ(last.metadata().at("format"), "pt");
  EXPECT_EQ(last.info("layers.0.weight").shape, (std::vector<int64_t>{save_world == 2 ? 2 : 0, 3}));
  EXPECT_FALSE(last.contains("step")) << "0-dim tensors live on rank 0 only";

  for (int reader_world : {1, 2, 3, 4}) expect_reads_back(root.str(), 100, reader_world);
  expect_reads_back(root / "iter_0000010", 100, 1);  // an iter_N directory works as well as a save_root
}

INSTANTIATE_TEST_SUITE_P(Worlds, ShardedCheckpointSave, ::testing::Values(2, 4));

TEST(ShardedCheckpoint, LaterSaveMovesLatestAndSameIterationIsReplaced) {
  TempDir root;
  std::vector<std::string> latest_after(3);
  testing::run_ranks(2, [&](Comm& comm) {
    save_model(root.str(), 10, comm, 100);
    if (comm.rank() == 0) latest_after[0] = read_bytes(root / "latest");
    save_model(root.str(), 20, comm, 200);
    if (comm.rank() == 0) latest_after[1] = read_bytes(root / "latest");
    save_model(root.str(), 20, comm, 250);  // back to back, same iteration: replaces it
    if (comm.rank() == 0) latest_after[2] = read_bytes(root / "latest");
  });
  EXPECT_EQ(latest_after, (std::vector<std::string>{"iter_0000010\n", "iter_0000020\n", "iter_0000020\n"}));
  EXPECT_EQ(CheckpointReader(root.str()).iteration(), 20);
  expect_reads_back(root.str(), 250, 3);
  expect_reads_back(root / "iter_0000010", 100, 3);  // the older one is untouched

  // Saving iteration 20 again on a different world size replaces it whole: no rank_00001 left over.
  testing::run_ranks(1, [&](Comm& comm) { save_model(root.str(), 20, comm, 300); });
  EXPECT_EQ(read_bytes(root / "latest"), "iter_0000020\n");
  CheckpointReader reader(root.str());
  EXPECT_EQ(reader.saved_world_size(), 1);
  EXPECT_FALSE(fs::exists(root / "iter_0000020/rank_00001.safetensors"));
  expect_reads_back(root.str(), 300, 2);
  for (const auto& entry : fs::directory_iterator(root.str()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

// keep_latest_k: the newest k complete checkpoints stay, never the one `latest` names, and a
// save in progress (*.tmp) is not touched.
TEST(ShardedCheckpoint, PruneKeepsTheNewestAndTheLatest) {
  TempDir root;
  testing::run_ranks(2, [&](Comm& comm) {
    for (int64_t it : {10, 20, 30, 40}) save_model(root.str(), it, comm, 100 + it);
  });
  fs::create_directory(root / "iter_0000050.tmp");  // a save being written
  EXPECT_EQ(checkpoint_prune(root.str(), 2, "").removed, (std::vector<std::string>{"iter_0000010", "iter_0000020"}));
  EXPECT_FALSE(fs::exists(root / "iter_0000010"));
  EXPECT_TRUE(fs::exists(root / "iter_0000030"));
  EXPECT_TRUE(fs::exists(root / "iter_0000050.tmp"));
  expect_reads_back(root.str(), 140, 2);
  // `latest` pointing at an older checkpoint (a resume that saved again) keeps it.
  write_bytes(root / "latest", "iter_0000030\n");
  EXPECT_EQ(checkpoint_prune(root.str(), 1, "").removed, (std::vector<std::string>{}));  // 30 is latest, 40 the newest
  EXPECT_TRUE(fs::exists(root / "iter_0000030") && fs::exists(root / "iter_0000040"));
  for (const auto& entry : fs::directory_iterator(root.str()))
    EXPECT_EQ(entry.path().filename().string().find(".pruned"), std::string::npos) << entry.path();
  EXPECT_FALSE(checkpoint_prune(root.str(), 0, "").warnings.empty());  // never throws: a warning
}

// Pruning touches only its own lineage: another run's (or branch's) checkpoints in the same root
// stay, however old.
TEST(ShardedCheckpoint, PruneTouchesOnlyItsLineage) {
  TempDir root;
  testing::run_ranks(2, [&](Comm& comm) {
    save_model(root.str(), 10, comm, 110, "other");
    for (int64_t it : {20, 30, 40}) save_model(root.str(), it, comm, 100 + it, "mine");
  });
  const auto pruned = checkpoint_prune(root.str(), 1, "mine");
  EXPECT_EQ(pruned.removed, (std::vector<std::string>{"iter_0000020", "iter_0000030"}));
  EXPECT_TRUE(pruned.warnings.empty());
  EXPECT_TRUE(fs::exists(root / "iter_0000010"));  // the other lineage's, older than every one of mine
  EXPECT_TRUE(checkpoint_prune(root.str(), 1, "").removed.empty());  // no checkpoint of lineage "" here
}

// A directory that cannot be removed is a warning naming it and the error; the others go on.
TEST(ShardedCheckpoint, APruneThatFailsIsAWarningNotAnError) {
  TempDir root;
  testing::run_ranks(1, [&](Comm& comm) {
    for (int64_t it : {10, 20, 30}) save_model(root.str(), it, comm, 100 + it);
  });
  // iter_0000010 cannot be renamed to its .pruned name: a non-empty directory is in the way (ENOTEMPTY).
  fs::create_directories(root / "iter_0000010.tmp.pruned/in_the_way");
  const auto pruned = checkpoint_prune(root.str(), 1, "");
  EXPECT_EQ(pruned.removed, (std::vector<std::string>{"iter_0000020"}));
  ASSERT_EQ(pruned.warnings.size(), 1u);
  EXPECT_NE(pruned.warnings[0].find("cannot remove " + (root / "iter_0000010")), std::string::npos)
      << pruned.warnings[0];
  EXPECT_NE(pruned.warnings[0].find("errno 39"), std::string::npos) << pruned.warnings[0];
  EXPECT_TRUE(fs::exists(root / "iter_0000010/index.json"));
}

// A branch: checkpoints newer than a resume point are found, and archived (moved, never deleted).
TEST(ShardedCheckpoint, NewerCheckpointsAreFoundAndArchived) {
  TempDir root;
  testing::run_ranks(1, [&](Comm& comm) {
    for (int64_t it : {8, 12, 16}) save_model(root.str(), it, comm, 100 + it);
  });
  fs::create_directory(root / "iter_0000020.tmp");  // unfinished: not a checkpoint
  EXPECT_EQ(checkpoint_newer_than(root.str(), 8), (std::vector<std::string>{"iter_0000012", "iter_0000016"}));
  EXPECT_TRUE(checkpoint_newer_than(root.str(), 16).empty());
  const auto archive = checkpoint_archive(root.str(), {"iter_0000012", "iter_0000016"}, "archived_test");
  EXPECT_TRUE(checkpoint_newer_than(root.str(), 8).empty());
  expect_reads_back(archive + "/iter_0000016", 116, 1);
  EXPECT_THROW(checkpoint_archive(root.str(), {"../x"}, "archived_bad"), Error);
}

TEST(ShardedCheckpoint, CrashMidSaveLeavesThePreviousCheckpointLoadable) {
  TempDir root;
  testing::run_ranks(2, [&](Comm& comm) { save_model(root.str(), 10, comm, 100); });

  // A save of iteration 20 that died while rank 1 was writing: a tmp dir with a whole rank 0 file,
  // a truncated rank 1 file, no index.json; `latest` still names iteration 10; a half latest.tmp.
  fs::create_directories(root / "iter_0000020.tmp");
  fs::copy_file(root / "iter_0000010/rank_00000.safetensors", root / "iter_0000020.tmp/rank_00000.safetensors");
  const std::string rank1 = read_bytes(root / "iter_0000010/rank_00001.safetensors");
  write_bytes(root / "iter_0000020.tmp/rank_00001.safetensors", rank1.substr(0, rank1.size() / 2));
  fs::copy(root / "iter_0000010", root / "iter_0000030.tmp");  // a complete-looking crashed save
  write_bytes(root / "latest.tmp", "iter_00000");

  CheckpointReader previous(root.str());
  EXPECT_EQ(previous.iteration(), 10);
  expect_reads_back(root.str(), 100, 2);
  EXPECT_THROW_WITH(CheckpointReader{root / "iter_0000030.tmp"}, "iter_0000030.tmp", "unfinished");

  testing::run_ranks(2, [&](Comm& comm) { save_model(root.str(), 20, comm, 200); });
  EXPECT_EQ(read_bytes(root / "latest"), "iter_0000020\n");
  expect_reads_back(root.str(), 200, 4);
  EXPECT_FALSE(fs::exists(root / "iter_0000020.tmp"));
  EXPECT_FALSE(fs::exists(root / "iter_0000030.tmp"));
  EXPECT_FALSE(fs::exists(root / "latest.tmp"));
}

TEST(ShardedCheckpoint, ReaderErrorsNameThePath) {
  TempDir root;
  testing::run_ranks(2, [&](Comm& comm) { save_model(root.str(), 10, comm, 100); });
  const std::string iter_dir = root / "iter_0000010";

  EXPECT_THROW_WITH(CheckpointReader{root / "nowhere"}, root / "nowhere", "no such");
  TempDir empty;
  EXPECT_THROW_WITH(CheckpointReader{empty.str()}, empty.str(), "latest", "index.json");

  TempDir dangling;
  write_bytes(dangling / "latest", "iter_0000099\n");
  EXPECT_THROW_WITH(CheckpointReader{dangling.str()}, dangling / "latest", "iter_0000099", "does not exist");
  write_bytes(dangling / "latest", "../elsewhere\n");
  EXPECT_THROW_WITH(CheckpointReader{dangling.str()}, dangling / "latest", "../elsewhere");

  // Damaged copies of a good checkpoint.
  auto damaged_copy = [&](const std::string& name) {
    const std::string copy = root / name;
    fs::copy(iter_dir, copy);
    return copy;
  };
  const std::string truncated = damaged_copy("truncated");
  const std::string rank1_bytes = read_bytes(truncated + "/rank_00001.safetensors");
  write_bytes(truncated + "/rank_00001.safetensors", rank1_bytes.substr(0, rank1_bytes.size() - 3));
  EXPECT_THROW_WITH(CheckpointReader{truncated}, truncated + "/rank_00001.safetensors", "rank 1");

  const std::string missing = damaged_copy("missing");
  fs::remove(missing + "/rank_00001.safetensors");
  EXPECT_THROW_WITH(CheckpointReader{missing}, missing + "/rank_00001.safetensors", "no such file");

  const std::string bad_index = damaged_copy("bad_index");
  write_bytes(bad_index + "/index.json", "{\"format\": ");
  EXPECT_THROW_WITH(CheckpointReader{bad_index}, bad_index + "/index.json", "not valid JSON");

  const std::string no_state = damaged_copy("no_state");
  fs::remove(no_state + "/trainer_state.json");
  EXPECT_THROW_WITH(CheckpointReader{no_state}, no_state, "trainer_state.json");

  // index.json claiming rows that do not tile the tensor.
  const std::string gap = damaged_copy("gap");
  std::string index = read_bytes(gap + "/index.json");
  auto json = nlohmann::ordered_json::parse(index);
  json["tensors"]["bias"]["shards"][1]["rows"] = {4, 5};
  write_bytes(gap + "/index.json", json.dump(2));
  EXPECT_THROW_WITH(CheckpointReader{gap}, gap + "/index.json", "'bias'", "no rank holds rows [3, 4)");

  // A world size past 32 bits is refused, not wrapped (4294967297 used to read as 1).
  const std::string huge = damaged_copy("huge_world");
  json = nlohmann::ordered_json::parse(read_bytes(huge + "/index.json"));
  json["world_size"] = 4294967297ull;
  write_bytes(huge + "/index.json", json.dump(2));
  EXPECT_THROW_WITH(CheckpointReader{huge}, huge + "/index.json", "'world_size' must be an integer of 32 bits, found 4294967297");
  json["world_size"] = 2;
  json["tensors"]["bias"]["shards"][1]["rank"] = 4294967297ull;
  write_bytes(huge + "/index.json", json.dump(2));
  EXPECT_THROW_WITH(CheckpointReader{huge}, huge + "/index.json", "'bias'", "'rank' must be an integer of 32 bits");

  // A shard whose checksum field is gone: an error in a checkpoint written with checksums
  // (version 2); a version-1 checkpoint, written before checksums, loads its shards unchecked.
  const std::string no_crc = damaged_copy("no_crc");
  json = nlohmann::ordered_json::parse(read_bytes(no_crc + "/index.json"));
  EXPECT_EQ(json["version"], 2);
  json["tensors"]["embed"]["shards"][1].erase("crc32c");
  write_bytes(no_crc + "/index.json", json.dump(2));
  EXPECT_THROW_WITH(CheckpointReader{no_crc}, no_crc + "/index.json", "'embed'", "rank 1's shard has no crc32c");
  json["version"] = 1;
  write_bytes(no_crc + "/index.json", json.dump(2));
  EXPECT_TRUE(bitwise_equal(CheckpointReader(no_crc).read_full("embed"), model_tensors(100)[1].second));

  CheckpointReader reader(root.str());
  EXPECT_THROW_WITH(reader.read_full("nope"), iter_dir, "'nope'");
  EXPECT_THROW_WITH(reader.read_rows("embed", 3, 8), iter_dir, "'embed'", "[3, 8)", "7 rows");
  EXPECT_THROW_WITH(reader.read_rows("step", 0, 1), iter_dir, "'step'", "0-dim");
  EXPECT_THROW_WITH(reader.rank_state(2), iter_dir, "rank 2", "2 ranks");
}

// A checkpoint is read only from its own directory: index.json naming a rank file outside it (a
// parent path, an absolute path) or a rank file that is a symlink is refused naming the entry,
// and nothing outside is opened.
TEST(ShardedCheckpoint, FileNamesStayInsideTheCheckpointDirectory) {
  TempDir root, outside;
  testing::run_ranks(2, [&](Comm& comm) { save_model(root.str(), 10, comm, 100); });
  const std::string iter_dir = root / "iter_0000010";
  fs::copy(iter_dir + "/rank_00000.safetensors", outside / "rank_00000.safetensors");
  auto with_file_name = [&](const std::string& copy, const std::string& name) {
    fs::copy(iter_dir, copy);
    auto json = nlohmann::ordered_json::parse(read_bytes(copy + "/index.json"));
    json["files"][0] = name;
    write_bytes(copy + "/index.json", json.dump(2));
    return copy;
  };
  const std::string up = with_file_name(root / "up", "../../" + fs::path(outside.str()).filename().string() +
                                                        "/rank_00000.safetensors");
  EXPECT_THROW_WITH(CheckpointReader{up}, up + "/index.json", "refused: rank 0's file is '../../",
                    "which is not a plain file name inside");
  const std::string absolute = with_file_name(root / "absolute", outside / "rank_00000.safetensors");
  EXPECT_THROW_WITH(CheckpointReader{absolute}, "refused: rank 0's file is '" + (outside / "rank_00000.safetensors"));
  const std::string dots = with_file_name(root / "dots", "..");
  EXPECT_THROW_WITH(CheckpointReader{dots}, "refused: rank 0's file is '..'");

  const std::string linked = root / "linked";
  fs::copy(iter_dir, linked);
  fs::remove(linked + "/rank_00000.safetensors");
  fs::create_symlink(outside / "rank_00000.safetensors", linked + "/rank_00000.safetensors");
  EXPECT_THROW_WITH(CheckpointReader{linked}, linked + "/rank_00000.safetensors", "refused: a symlink");
  expect_reads_back(root.str(), 100, 2);  // the real one still reads
}

// One flipped bit anywhere in a shard's bytes is found on the first read of that shard (and by
// verify), naming the file, the tensor and its rows; the other shards still read.
TEST(ShardedCheckpoint, AFlippedBitIsAnErrorNamingFileAndTensor) {
  TempDir root;
  testing::run_ranks(2, [&](Comm& comm) { save_model(root.str(), 10, comm, 300); });
  const std::string iter_dir = root / "iter_0000010";
  const auto index = nlohmann::json::parse(read_bytes(iter_dir + "/index.json"));
  for (const auto& [name, t] : index["tensors"].items())
    for (const auto& shard : t["shards"]) ASSERT_EQ(shard["crc32c"].get<std::string>().size(), 8u) << name;

  const auto report = CheckpointReader(iter_dir).verify();
  EXPECT_EQ(report.shards_without_checksum, 0);
  // layers.0.weight, embed, bias and mask on both ranks; one_row and step on rank 0; no_rows: none.
  EXPECT_EQ(report.shards_checked, 10);

  // Flip the lowest mantissa bit of one float of rank 1's "layers.0.weight" rows [3, 5).
  const std::string file = iter_dir + "/rank_00001.safetensors";
  std::string bytes = read_bytes(file);
  const auto info = SafetensorsFile(file).info("layers.0.weight");
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  bytes[8 + header + info.data_begin + 4] ^= 1;
  write_bytes(file, bytes);

  CheckpointReader reader(iter_dir);
  EXPECT_TRUE(bitwise_equal(reader.read_rows("layers.0.weight", 0, 3),
                            model_tensors(300)[0].second.slice(0, 0, 3).contiguous()));  // rank 0's shard
  EXPECT_THROW_WITH(reader.read_rows("layers.0.weight", 2, 5), file, "damaged", "'layers.0.weight'", "rows [3, 5)",
                    "checksum");
  EXPECT_THROW_WITH(CheckpointReader(iter_dir).verify(), file, "'layers.0.weight'");

  // A checkpoint written before checksums existed (version 1, no crc32c) still loads, unchecked.
  auto old = nlohmann::ordered_json::parse(read_bytes(iter_dir + "/index.json"));
  old["version"] = 1;
  for (auto& [name, t] : old["tensors"].items())
    for (auto& shard : t["shards"]) shard.erase("crc32c");
  write_bytes(iter_dir + "/index.json", old.dump(2));
  EXPECT_EQ(CheckpointReader(iter_dir).verify().shards_without_checksum, 10);
}

TEST(ShardedCheckpoint, BadShardsFailEveryRankWithoutHanging) {
  TempDir root;

  // Each case is saved on 2 ranks; every rank must throw (a rank left in a barrier would hang the
  // test until Gloo's 60 s timeout) and `latest` must still name iteration 10.
  struct Case {
    std::string name;
    std::function<std::vector<ShardedTensor>(int rank)> shards;
    std::vector<std::string> rank0_message, rank1_message;
  };
  const std::vector<Case> cases = {
      {"wrong_columns",
       [](int rank) {
         return std::vector<ShardedTensor>{{"w", {4, 3}, rank * 2, at::zeros({2, rank == 1 ? 4 : 3})}};
       },
       {"rank 1 did not write"},
       {"rank 1", "'w'", "[2, 4]", "[4, 3]"}},
      {"overlap",
       [](int) { return std::vector<ShardedTensor>{{"w", {4, 3}, 0, at::zeros({2, 3})}}; },
       {"'w'", "rank 1", "overlap"},
       {"rank 0 did not commit"}},
      {"rows_past_end",
       [](int rank) { return std::vector<ShardedTensor>{{"w", {4, 3}, rank * 3, at::zeros({2, 3})}}; },
       {"rank 1 did not write"},
       {"rank 1", "'w'", "[3, 5)", "4 rows"}},
      {"dtype_mismatch",
       [](int rank) {
         return std::vector<ShardedTensor>{{"w", {4}, rank * 2, at::zeros({2}, rank ? at::kHalf : at::kFloat)}};
       },
       {"'w'", "rank 1 saved F16"},
       {"rank 0 did not commit"}},
      {"duplicate_name",
       [](int rank) {
         return std::vector<ShardedTensor>{{"w", {2}, rank, at::zeros({1})}, {"w", {2}, rank, at::zeros({1})}};
       },
       {"rank 0", "'w'", "twice"},
       {"rank 1", "'w'", "twice"}},
  };
  // All in one 2-rank world: a failed save must leave both ranks ready for the next one.
  std::vector<std::vector<std::string>> messages(cases.size(), std::vector<std::string>(2));
  std::vector<std::string> latest_after(cases.size());
  std::vector<bool> iter20_after(cases.size());
  testing::run_ranks(2, [&](Comm& comm) {
    save_model(root.str(), 10, comm, 100);
    for (size_t i = 0; i < cases.size(); ++i) {
      try {
        checkpoint_save(root.str(), 20, comm, cases[i].shards(comm.rank()), {}, {}, {});
      } catch (const Error& e) {
        messages[i][comm.rank()] = e.what();
      }
      if (comm.rank() == 0) {
        latest_after[i] = read_bytes(root / "latest");
        iter20_after[i] = fs::exists(root / "iter_0000020");
      }
    }
    save_model(root.str(), 20, comm, 200);  // the failed saves' tmp dir does not get in the way
  });
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    for (int r = 0; r < 2; ++r) {
      ASSERT_FALSE(messages[i][r].empty()) << "rank " << r << " did not throw";
      for (const auto& part : r == 0 ? cases[i].rank0_message : cases[i].rank1_message)
        EXPECT_NE(messages[i][r].find(part), std::string::npos)
            << "rank " << r << " message lacks '" << part << "': " << messages[i][r];
    }
    EXPECT_EQ(latest_after[i], "iter_0000010\n");
    EXPECT_FALSE(iter20_after[i]);
  }
  expect_reads_back(root / "iter_0000010", 100, 1);
  expect_reads_back(root.str(), 200, 2);
}

TEST(ShardedCheckpoint, SaveRejectsNegativeIteration) {
  TempDir root;
  testing::run_ranks(1, [&](Comm& comm) {
    EXPECT_THROW_WITH(checkpoint_save(root.str(), -1, comm, {}, {}, {}, {}), "iteration", "-1");
  });
  EXPECT_EQ(checkpoint_dir_name(20), "iter_0000020");
  EXPECT_EQ(checkpoint_dir_name(123456789), "iter_123456789");
}

}  // namespace
}  // namespace mmtrain
