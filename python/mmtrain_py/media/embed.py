"""Prompt embeddings for `mmtrain sample magihuman`: the T5Gemma encoder's output for each prompt
(text.py, the same rule as prepare's captions) and for upstream's negative prompt.

    python -P -m mmtrain_py.media.embed --text-encoder DIR --prompts FILE.json --out DIR [--negative] ...

FILE.json (written by mmtrain) is a JSON list of prompt strings; OUT/prompt_<i>.safetensors holds
prompt_embeds [min(n, 640), hidden] fp16 for prompt i, OUT/negative.safetensors the negative's.
"""

import argparse
import os
import sys

import torch

from . import spec
from .clips import decode_caption
from .files import InputError, read_json, write_safetensors
from .text import TextEncoder


def parse(argv):
    p = argparse.ArgumentParser(prog="mmtrain sample (prompt embeddings)", description="flags are parsed by mmtrain")
    for name in ("--text-encoder", "--prompts", "--out", "--device", "--dtype"):
        p.add_argument(name, required=True)
    p.add_argument("--negative", action="store_true")
    return p.parse_args(argv)


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        prompts = read_json(args.prompts, "prompt list")
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise InputError("bad_prompts", f"{args.prompts}: expected a JSON list of strings")
        texts = [decode_caption(p, f"prompt {i}") for i, p in enumerate(prompts)]
        dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
        encoder = TextEncoder(args.text_encoder, args.device, dtype)
        jobs = [(f"prompt_{i}", text) for i, text in enumerate(texts)]
        if args.negative:
            jobs.append(("negative", spec.NEGATIVE_PROMPT))
        for name, text in jobs:
            embedding, tokens = encoder.encode(text)
            if tokens > spec.TEXT_TOKENS:
                print(f"embed: warning: {name}'s {tokens} tokens are trimmed to {spec.TEXT_TOKENS}", file=sys.stderr)
            write_safetensors(os.path.join(args.out, name + ".safetensors"), {"prompt_embeds": embedding})
        return 0
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
