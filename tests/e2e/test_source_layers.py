"""The source tree's shape (docs/architecture.md, "Layers"): a folder includes only folders above
it in the layer order, and the trainer, the command kit and core name no model, so that a new model
touches its own folder only (docs/adding_a_model.md). The engine's floors come first, then the
command kit (cli/), then the command rooms, one trade each, which lean on each other only where
COMMAND_ROOM_USES says."""
import re
import subprocess

from conftest import REPO

ENGINE = ["core", "io", "quant", "nn", "dist", "offload", "optim", "checkpoint", "fsdp", "parallel", "models", "data",
          "record", "config", "plan", "train"]
KIT = "cli"
COMMAND_ROOMS = ["convert", "adapters", "analysis", "planning", "debugging", "runs", "media", "sample", "rl"]
LAYERS = ENGINE + [KIT] + COMMAND_ROOMS
# The only includes from one command room into another: the adapters' verbs write through
# convert's output rules; eval and sample load --load's weights in any format through
# convert/model_weights.h; plan --calibrate reads run logs with analysis' parser; GRPO's rollouts
# generate with sample's token generator and its Magistral prompts' rules.
COMMAND_ROOM_USES = {"adapters": {"convert"}, "runs": {"convert"}, "sample": {"convert"}, "planning": {"analysis"},
                     "rl": {"sample"}}
# Rooms of one trade each that must not lean on each other although the order would allow it: what a
# run records about itself is not the planner's, and the planner predicts without the records' code.
SIBLINGS = [("plan", "record")]
INCLUDE = re.compile(r'^\s*#include "(\w+)/')
# A command room stays small enough to read in a sitting (lines of its .h and .cpp files).
MAX_ROOM_LINES = 1500


def sources():
    return sorted(p for p in (REPO / "src").rglob("*") if p.suffix in (".cpp", ".h"))


def test_includes_point_down_the_layers():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = []
    for path in sources():
        layer = path.relative_to(REPO / "src").parts[0]
        assert layer in rank, f"{path}: folder {layer!r} is not in the layer order"
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if m and m.group(1) in rank and rank[m.group(1)] > rank[layer]:
                upward.append(f"{path.relative_to(REPO)}:{number}: {layer} includes {m.group(1)}")
    assert not upward, "\n".join(upward)


def test_siblings_include_neither_way():
    crossing = []
    for a, b in SIBLINGS:
        for here, there in ((a, b), (b, a)):
            for path in sorted((REPO / "src" / here).rglob("*")):
                if path.suffix not in (".cpp", ".h"):
                    continue
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    m = INCLUDE.match(line)
                    if m and m.group(1) == there:
                        crossing.append(f"{path.relative_to(REPO)}:{number}: {here} includes {there}")
    assert not crossing, "\n".join(crossing)


def test_trainer_kit_and_core_name_no_model():
    named = []
    for folder in (KIT, "train", "plan", "record", "config", "core"):
        for path in sorted((REPO / "src" / folder).rglob("*")):
            if path.suffix not in (".cpp", ".h"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"magihuman|mistral3", line, re.IGNORECASE):
                    named.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not named, "\n".join(named)


def test_models_know_nothing_of_parallelism():
    """A model sees its packed sequence through nn/sequence_split.h; how it is split (context
    parallelism), recomputed or sharded is the parallelize chain's business, as in torchtitan."""
    reaching = []
    for path in sorted((REPO / "src" / "models").rglob("*")):
        if path.suffix not in (".cpp", ".h"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r'^\s*#include "(parallel|fsdp)/', line):
                reaching.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not reaching, "\n".join(reaching)


def test_command_rooms_lean_on_each_other_only_where_stated():
    crossing = []
    for room in COMMAND_ROOMS:
        for path in sorted((REPO / "src" / room).rglob("*")):
            if path.suffix not in (".cpp", ".h"):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) in COMMAND_ROOMS and m.group(1) != room and \
                        m.group(1) not in COMMAND_ROOM_USES.get(room, set()):
                    crossing.append(f"{path.relative_to(REPO)}:{number}: {room} includes {m.group(1)}")
    assert not crossing, "\n".join(crossing)


def test_every_command_room_says_what_it_owns_and_stays_small():
    for room in [KIT] + COMMAND_ROOMS:
        folder = REPO / "src" / room
        readme = folder / "README.md"
        assert readme.is_file() and readme.read_text().startswith(f"# {room}/"), f"{folder} needs a README.md header"
        lines = sum(len(p.read_text().splitlines()) for p in folder.rglob("*") if p.suffix in (".cpp", ".h"))
        assert lines <= MAX_ROOM_LINES, f"src/{room} has {lines} lines (over {MAX_ROOM_LINES}): split it by trade"


def test_python_lives_in_one_package_beside_src():
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not [p for p in tracked if p.startswith("src/")], "Python belongs in python/mmtrain_py, not src/"
    package = [p for p in tracked if p.startswith("python/")]
    assert package and all(p.startswith("python/mmtrain_py/") for p in package), package


# What starts a program: the kit's runner is the only place that starts the project's Python;
# core/subprocess.cpp is the mechanism under it, ablate starts its arms' mmtrain (or the user's
# --launcher) itself, with torchrun from the runner, and GRPO's command reward starts the user's
# program (training.grpo.reward_command).
PROCESS_START = re.compile(r"\b(run_process|execv\w*|execl\w*|posix_spawn\w*|popen|system|fork)\s*\(")
# The interpreter, its isolation flag or a script path named in code: only the runner builds those.
PYTHON_START = re.compile(r'MMTRAIN_PYTHON|project_python\(|"-P"|\.py"')
STARTS_ALLOWED = {"src/core/subprocess.cpp", "src/core/subprocess.h", "src/cli/python_runner.cpp",
                  "src/analysis/ablate.cpp", "src/rl/user_rewards.cpp"}


def test_the_kit_runner_is_the_only_start_of_the_projects_python():
    starts, pythons = [], []
    for path in sources():
        relative = str(path.relative_to(REPO))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if PROCESS_START.search(code) and relative not in STARTS_ALLOWED:
                starts.append(f"{relative}:{number}: {line.strip()}")
            if PYTHON_START.search(code) and not relative.startswith("src/cli/python_runner."):
                pythons.append(f"{relative}:{number}: {line.strip()}")
    assert not starts, "a program started outside the kit's runner:\n" + "\n".join(starts)
    assert not pythons, "Python named outside the kit's runner:\n" + "\n".join(pythons)
    ablate = (REPO / "src" / "analysis" / "ablate.cpp").read_text()
    assert "run_python(" in ablate  # torchrun, the one Python ablate starts, goes through the runner
