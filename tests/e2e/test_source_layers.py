"""The source tree's shape (docs/architecture.md, "Layers"): a folder includes only folders above
it in the layer order, and the trainer, the tools and core name no model, so that a new model
touches its own folder only (docs/adding_a_model.md)."""
import re

from conftest import REPO

LAYERS = ["core", "io", "quant", "nn", "dist", "offload", "optim", "checkpoint", "fsdp", "parallel", "models", "data",
          "record", "config", "plan", "train", "tools", "media", "sample"]
# Rooms of one trade each that must not lean on each other although the order would allow it: what a
# run records about itself is not the planner's, and the planner predicts without the records' code.
SIBLINGS = [("plan", "record")]
INCLUDE = re.compile(r'^\s*#include "(\w+)/')


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


def test_trainer_tools_and_core_name_no_model():
    named = []
    for folder in ("tools", "train", "plan", "record", "config", "core"):
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
