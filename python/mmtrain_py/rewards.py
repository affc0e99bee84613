"""A user's GRPO reward function over one batch of completions (training.grpo.reward_funcs
"module:function"; src/rl/user_rewards.h). mmtrain runs this module in a process of its own, with a
time limit, for every batch:

    python -P -m mmtrain_py.rewards --function MODULE:FUNCTION --input IN.jsonl --output OUT.json [--path DIR]...

IN.jsonl holds one completion a line ({"prompt", "completion", "completion_ids", "truncated",
"fields"}); the function is called once, TRL's way, with a list per argument:

    function(prompts=[...], completions=[...], completion_ids=[...], truncated=[...], **{field: [...]})

(a field a record lacks is None in its list) and must return one finite number per completion,
written to OUT.json as a JSON list. Anything else fails with a message mmtrain shows.
"""
import argparse
import importlib
import json
import math
import sys

RESERVED = ("prompts", "completions", "completion_ids", "truncated")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--function", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--path", action="append", default=[])
    args = parser.parse_args()
    sys.path[:0] = args.path
    module_name, _, function_name = args.function.partition(":")
    function = getattr(importlib.import_module(module_name), function_name, None)
    if not callable(function):
        sys.exit(f"{args.function}: module {module_name} has no function {function_name}")

    with open(args.input, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    columns = {"prompts": [r["prompt"] for r in rows], "completions": [r["completion"] for r in rows],
               "completion_ids": [r["completion_ids"] for r in rows], "truncated": [r["truncated"] for r in rows]}
    fields = sorted({key for r in rows for key in r["fields"]})
    for key in fields:
        if key in RESERVED:
            sys.exit(f"{args.function}: a prompt record field is named {key!r}, which is one of the arguments "
                     f"{RESERVED}; rename the field")
        columns[key] = [r["fields"].get(key) for r in rows]

    values = function(**columns)
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError) as e:
        sys.exit(f"{args.function} returned {type(values).__name__} that is not a list of numbers ({e})")
    if len(values) != len(rows):
        sys.exit(f"{args.function} returned {len(values)} rewards for {len(rows)} completions")
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        sys.exit(f"{args.function} returned non-finite rewards {[values[i] for i in bad[:4]]} "
                 f"(completions {bad[:4]}): a reward must be a finite number")
    with open(args.output, "x", encoding="utf-8") as f:
        json.dump(values, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
