"""Do the hostile-input and fault tests guard their fixes? Each entry breaks one fix in the
source (one exact string replaced), rebuilds, runs the test that should catch it, and restores
the file. Every test must fail while its fix is broken. About 10 minutes on 2 cores:

    python3 scripts/check_guards.py            # all
    python3 scripts/check_guards.py pixel CRC  # the entries whose name contains a word

Run it on a clean tree (it rewrites files in place and restores them). Writes
build/check_guards.json. An entry whose string no longer occurs fails loudly: update it."""
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
G = "build/bin/mmtrain_tests --gtest_filter="
PY = "MMTRAIN_BIN=build/bin/mmtrain timeout 400 .venv/bin/python -m pytest -q -x tests/e2e/"
M = [
 ("json depth limit", "src/core/json_read.cpp", "if (json_nesting_depth(text) > kMaxJsonDepth)", "if (false && json_nesting_depth(text) > kMaxJsonDepth)", G + "JsonRead.*:SafetensorsTest.*"),
 ("YAML depth bound (alias cycle)", "src/core/config_schema.cpp", "if (depth > kMaxYamlDepth)", "if (false)", G + "ConfigTest.AliasCyclesAndBombsAreRefused"),
 ("YAML value bound (alias bomb)", "src/core/config_schema.cpp", "if (++values > kMaxYamlValues)", "if (++values < 0)", G + "ConfigTest.AliasCyclesAndBombsAreRefused"),
 ("pickle container bound", "src/core/pickle_scan.cpp", "if (++scan.containers > kMaxPickleContainers)", "if (++scan.containers < 0)", G + "PickleScan.*"),
 ("model sizes >= 1", "src/models/config_check.h", "if (value < minimum) fail(", "if (false) fail(", G + "ModelConfig.*"),
 ("sigaltstack", "src/core/fatal_signal.cpp", "if (stack.ss_sp) sigaltstack(&stack, nullptr);", "", G + "FatalSignal*"),
 ("launch env strict ints", "src/dist/runtime.cpp", "int parsed = std::stoi(value, &used);", "int parsed = static_cast<int>(std::stoll(value, &used));", G + "LaunchEnv*"),
 ("PNG CRC check", "src/data/image/image_decode.cpp", "  check_png_chunks(data, size, label);\n", "", G + "ImageDecode.*"),
 ("pixel cap", "src/data/image/image_decode.cpp", "  if (width * height > max_pixels)", "  if (false)", G + "ImageDecode.*"),
 ("regular-file check", "src/core/regular_file.cpp", "  if (std::filesystem::is_regular_file(status)) return;", "  return;", G + "Preflight.*:ImageDecode.*:MagiHumanDatasetTest.*:ConfigTest.*"),
 ("NaN/Inf in a sample", "src/data/magihuman/precomputed_dataset.cpp", "if (!finite_rows.all().item<bool>()) {", "if (false) {", G + "MagiHumanDatasetTest.NonFinite*"),
 ("T*H*W overflow", "src/data/magihuman/precomputed_dataset.cpp", "if (__builtin_mul_overflow(thw[0], thw[1], &tokens) || __builtin_mul_overflow(tokens, thw[2], &tokens))", "if ((tokens = thw[0] * thw[1] * thw[2]), false)", G + "MagiHumanDatasetTest.NonFinite*"),
 ("bad image is a skip", "src/data/conversation/conversation_dataset.cpp", "undecodable_.size());\n      return std::nullopt;", "undecodable_.size());\n      throw;", G + "ConversationDataset.*"),
 ("heartbeat names the dead rank", "src/dist/peer_watch.cpp", "if (r != rank_ && after[static_cast<size_t>(r)] == before[static_cast<size_t>(r)]) silent.push_back(r);", "", G + "PeerWatch.*"),
 ("index.json ints not wrapped", "src/checkpoint/sharded_checkpoint.cpp", "  if (!fits) fail(", "  if (false) fail(", G + "ShardedCheckpoint.ReaderErrorsNameThePath"),
 ("tokenizer ids bounded", "src/data/tokenizer/hf_bpe.cpp", "if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxTokenId)", "if (false)", G + "HfBpeTokenizer.*"),
 ("checkpoint checksum verified", "src/checkpoint/sharded_checkpoint.cpp", "    if (crc != *shard.crc32c)\n      fail(", "    if (false)\n      fail(", PY + "test_faults.py -k flipped_bit"),
 ("strict resume: model config", "src/train/state.cpp", "  check_same_model_config(reader, options);\n", "", PY + "test_faults.py -k refuses_a_different_model"),
 ("trainer_state typed reads", "src/train/state.cpp", "  if (!g.is_object() || !g.contains(key) || !g[key].is_number_integer())", "  if (false)", PY + "test_faults.py -k damaged_trainer_state"),
 ("memory pre-flight", "src/train/trainer.cpp", "    preflight_memory(c, *model, runtime.env, runtime.device, dims.fsdp());\n", "", PY + "test_faults.py -k 15b"),
 ("training.load: auto", "src/train/trainer.cpp", "    if (checkpoint_saved_under(t.save)) {", "    if (false) {", PY + "test_faults.py -k restart_resumes"),
 ("non-finite step stops the run", "src/train/train_step.cpp", "  if (any_bad) {", "  if (false) {", G + "TrainStep.*"),
 ("non-finite state never saved", "src/train/state.cpp", "  if (!comm.any_rank(!bad.empty())) return;", "  return;", G + "StateSave.*"),
 ("lr bounded", "src/config/training_config.cpp", "        if (t.lr > kMaxLearningRate) check.invalid(\"lr\", lr_cap, number(t.lr));", "", G + "ConfigTest.*"),
 ("missing checksum field", "src/checkpoint/sharded_checkpoint.cpp", "if (!s.contains(\"crc32c\") && has_checksums)", "if (false)", G + "ShardedCheckpoint.ReaderErrorsNameThePath"),
 ("RNG state checked", "src/train/state.cpp", "  if (state.numel() != expected)", "  if (false)", G + "StateRng.*"),
 ("output_dir pre-flight", "src/plan/preflight.cpp", "  require_writable_dir(config, \"logging.output_dir\", config.logging.output_dir, rank);\n", "", G + "Preflight.*"),
 ("load = save root says auto", "src/plan/preflight.cpp", "  if (!t.load.empty() && t.load != \"auto\" && !t.save.empty() &&", "  if (false &&", G + "Preflight.*"),
 ("weights regular-file check", "src/train/hf_weights.cpp", "    require_regular_file(path, \"model weights '\" + path + \"'\", \"a .safetensors file or an HF model directory\");", "    fail(\"model weights '\", path, \"': no such file or directory\");", G + "WeightSource.*"),
 ("NaN/Inf in HF weights", "src/train/hf_weights.cpp", "if (const int64_t bad = first_non_finite(rows); bad >= 0)", "if (const int64_t bad = -1; bad >= 0)", G + "WeightSource.*"),
 ("irregular image named", "src/data/conversation/conversation_dataset.cpp", "image_problem = fs::exists(path) || relative.empty() ? \"image not a regular file\" : \"image file missing\";", "image_problem = \"image file missing\";", G + "ConversationDataset.*"),
 ("resize inside the skip", "src/data/conversation/conversation_dataset.cpp", "      try {\n        sample.resized.push_back(resized_size());\n      } catch", "      sample.resized.push_back(resized_size());\n      try {\n      } catch", G + "ConversationDataset.*"),
 ("cutoff_len >= 0", "src/data/conversation/conversation_dataset.cpp", "  if (o.cutoff_len < 0) fail(", "  if (false) fail(", G + "ConversationDataset.*"),
 ("token_file keys checked", "src/data/token_file_dataset.cpp", "  params.check_known_keys({\"dataset_type\", \"path\", \"max_samples\"});", "", G + "TokenFileDataset.*"),
 ("silent heartbeat ends the wait", "src/dist/peer_watch.cpp", "    if (silent) {", "    if (false) {", G + "PeerWatch.*"),
 ("overflowing sample named", "src/train/train_step.cpp", "(NaN/Inf)\", reading(),", "(NaN/Inf)\",", PY + "test_magihuman_ranks.py -k overflows"),
 ("yaml-cpp's depth guard named", "src/core/config_schema.cpp", "  } catch (const YAML::DeepRecursion& e) {", "  } catch (const YAML::DeepRecursion& e) {\n    throw;", G + "ConfigTest.DeepNesting*"),
 ("PNG header over the cap", "src/data/image/image_decode.cpp", "    check_png_header_pixels(data, size, max_pixels, label);", "", G + "ImageDecode.*"),
 ("JSON object is not JSONL", "src/data/conversation/conversation_dataset.cpp", "if (records.empty() && text[first] == '{'", "if (false", G + "ConversationDataset.*"),
 ("one run per save root", "src/train/save_root_lock.cpp", "  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {", "  if (false) {", G + "SaveRootLock.*"),
 ("pinned global batch checked", "src/config/config.cpp", "  if (t.global_batch_size % per_micro != 0)", "  if (false)", G + "ConfigTest.WorldSizeChecks"),
 ("keep_latest_k keeps latest", "src/checkpoint/sharded_checkpoint.cpp", "    if (name == latest) continue;\n", "", G + "ShardedCheckpoint.Prune*"),
 ("finished run is an error", "src/train/trainer.cpp", "    if (t.load != \"auto\")\n      fail(", "    if (false)\n      fail(", PY + "test_run_tools.py -k rerun"),
]
only = sys.argv[1:]
results = []
for name, path, old, new, test in M:
    if only and not any(o in name for o in only): continue
    full = os.path.join(REPO, path)
    src = open(full).read()
    if src.count(old) != 1:
        sys.exit(f"{name}: '{old}' occurs {src.count(old)} times in {path}, expected once: update this entry")
    open(full, "w").write(src.replace(old, new))
    t0 = time.time()
    try:
        b = subprocess.run("cmake --build build -j2", shell=True, cwd=REPO, capture_output=True, text=True)
        if b.returncode != 0:
            outcome = "BUILD FAILED: " + b.stdout[-500:]
        else:
            # The address-space cap keeps a broken alias-bomb bound from taking the machine's memory.
            r = subprocess.run("ulimit -v 8000000; " + test, shell=True, cwd=REPO, capture_output=True, text=True, timeout=600)
            outcome = "test FAILS (good)" if r.returncode != 0 else "test PASSES (bad: the test does not guard it)"
    except subprocess.TimeoutExpired:
        outcome = "test timed out (counts as failing)"
    finally:
        open(full, "w").write(src)
    results.append((name, test.replace(G, "gtest ").replace(PY, "pytest "), outcome, round(time.time() - t0)))
    print(f"{name:40s} {outcome[:60]:60s} {round(time.time()-t0)} s", flush=True)
subprocess.run("cmake --build build -j2", shell=True, cwd=REPO, capture_output=True)
json.dump(results, open(os.path.join(REPO, "build", "check_guards.json"), "w"), indent=1)
sys.exit(0 if all("FAILS" in r[2] or "timed out" in r[2] for r in results) else 1)
