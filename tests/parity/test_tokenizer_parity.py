"""Tokenizer parity: mmtrain's C++ tokenizers against the Python references, id for id.

Contract:
  * Corpus: make_corpus() builds >= 1000 deterministic strings (Latin, CJK, Arabic, Cyrillic,
    Devanagari, Hangul, Thai, Hebrew, emoji incl. ZWJ/skin-tone/flag sequences, code, digits and
    long numbers, whitespace runs, tabs, CR/LF, Unicode spaces such as U+0085/U+00A0/U+3000,
    combining marks, and control-token look-alikes "[INST]", "</s>", "<s>", "[IMG]" in user text).
  * Tekken: the real tekken file mistral-common ships (mistral_common/data/tekken_240911.json,
    v3, 150000 ranks, default_vocab_size 131072, no special_tokens list) and a v13-style copy
    of it with an explicit special_tokens list (like Magistral-Small-2509's tekken.json), each
    compared with mistral-common's Tekkenizer.encode(s, bos=False, eos=False) and its decode.
  * HF: a byte-level BPE tokenizer.json built here from the same tekken ranks the way Mistral's
    HF repos carry it (1000 special added tokens, Split with the Llama-3 regex that Mistral-Small
    3.x shipped, ByteLevel, ignore_merges, merges generated from the ranks), compared with the
    `tokenizers` library: as is, with fix_mistral_regex (pre_tokenizer[0] replaced exactly as
    transformers does), and with split_special_tokens (tokenizers' encode_special_tokens).
  * Wide corpus: make_wide_corpus() adds 3000 strings of random code points over planes 0-3
    (unassigned ones and odd spaces such as U+0085, U+180E, U+200B, U+001C included), to catch
    regex-engine and Unicode-table differences (PCRE2 vs Rust regex vs Oniguruma).
  * Every comparison must have 0 mismatches; the figures go to the parity summary.
The C++ side runs through the hidden `mmtrain debug tokenize` subcommand ($MMTRAIN_BIN).
"""
import base64
import json
import os
import random
import subprocess

import pytest
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
import mistral_common
from tokenizers import Regex, Tokenizer, pre_tokenizers

TEKKEN_FILE = os.path.join(os.path.dirname(mistral_common.__file__), "data", "tekken_240911.json")

# What Mistral-Small-3.1/3.2's tokenizer.json carries: the wrong one.
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# transformers' fix_mistral_regex pattern (= tekken.json config.pattern).
TEKKEN_REGEX = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
                r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

V13_EXTRA_SPECIALS = ["[AUDIO]", "[BEGIN_AUDIO]", "[OUTPUT_AUDIO]", "[REF]", "[/REF]", "[ARGS]", "[CALL_ID]",
                      "[THINK]", "[/THINK]"]
DEFAULT_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
                    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
                    "[TOOL_CONTENT]"]

FRAGMENTS = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "iPhone McDonald's HTTPServer XMLHttpRequest",
    "don't won't I'm we'll they've she'd IT'S", "naïve café résumé coöperate Ångström", "straße ß ẞ ǅ ǈ ǋ",
    "日本語のテキストです。", "中文文本，包含标点符号！", "한국어 텍스트입니다.", "ภาษาไทยไม่มีช่องว่าง",
    "مرحبا بالعالم، كيف حالك؟", "שלום עולם", "Привет, мир! Ёлки-палки.", "ПРИВЕТ мир", "नमस्ते दुनिया। हिन्दी पाठ",
    "Ελληνικά κείμενα", "Tiếng Việt có dấu", "ⅫⅣ ½ ¾ ² ³ ٣٤٥ ०१२३ 𝟘𝟙𝟚",
    "👍 🎉🎉 👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈 🇫🇷🇯🇵 ❤️‍🔥 🧑🏿‍🤝‍🧑🏻", "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937",
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "<div class=\"x\">&amp;</div>", "SELECT * FROM t WHERE id = 42;", "https://example.com/a/b?c=d&e=f#g",
    "path/to/file.txt //comment /* block */", "x=1;y=-2.5e-10;z=0xFF", "λx. x + 1 ∀ε>0 ∃δ",
    "1234567890", "3.14159265358979323846", "1,000,000 and 1 000 000", "-0.0001", "2024-11-29T10:07:42Z",
    "[INST]", "[/INST]", "</s>", "<s>", "[IMG]", "[IMG_BREAK]", "[SYSTEM_PROMPT]", "<unk>", "<pad>", "[THINK]",
    "<SPECIAL_42>", "[INST] what is this? [/INST]", "<s>[INST]hi[/INST]hello</s>",
    "   ", "\t\t", "\n\n\n", "\r\n", " \n ", "a\u00a0b", "a\u0085b", "a\u3000b", "a\u2028b\u2029c", "a\u200bb",
    "a\u180eb", "a\u2009b\u202fc", "\u00ad soft hyphen", "\ufeffBOM", "tab\tseparated\tvalues",
    "MiXeD CaSe WoRdS", "ALLCAPS", "lowercase", "CamelCaseWordsHere", "snake_case_words", "kebab-case-words",
    "!!!???...", "—–-", "«quotes» „quotes“ 'single' \"double\"", "€100 £50 ¥1000 $9.99", "@user #hashtag",
]

RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x5FF), (0x600, 0x6FF),
          (0x900, 0x97F), (0xE00, 0xE7F), (0x3040, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
          (0x1F300, 0x1F64F), (0x2000, 0x206F), (0x2190, 0x22FF), (0x1D400, 0x1D4FF)]


def make_corpus(count: int = 1200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    corpus = list(FRAGMENTS)
    corpus += ["", " ", "a", "\n", " " * 3000, "9" * 500, "ab" * 800, "\n \n\t\r\n" * 40]
    while len(corpus) < count:
        kind = rng.random()
        if kind < 0.45:  # fragments glued with random separators
            parts = rng.choices(FRAGMENTS, k=rng.randint(1, 5))
            seps = ["", " ", "  ", "\n", "\t", " \n", "\r\n", "  \n\n", "\u00a0"]
            corpus.append("".join(p + rng.choice(seps) for p in parts))
        elif kind < 0.75:  # random code points from several scripts, with spaces
            chars = []
            for _ in range(rng.randint(1, 60)):
                if rng.random() < 0.15:
                    chars.append(rng.choice([" ", " ", "\n", "\t", "  "]))
                else:
                    lo, hi = rng.choice(RANGES)
                    chars.append(chr(rng.randint(lo, hi)))
            corpus.append("".join(chars))
        elif kind < 0.85:  # numbers and digits mixed with text
            corpus.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 30))) + rng.choice(["", "px", ".5", "%", "k"])
                                   for _ in range(rng.randint(1, 8))))
        else:  # control-token look-alikes inside user text
            specials = DEFAULT_SPECIALS + V13_EXTRA_SPECIALS + ["<SPECIAL_999>"]
            corpus.append(rng.choice(FRAGMENTS) + rng.choice(specials) + rng.choice(FRAGMENTS) +
                          rng.choice(["", " "]) + rng.choice(specials))
    return corpus


def make_wide_corpus(count: int = 3000, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    odd = [0x85, 0xA0, 0x180E, 0x200B, 0x2028, 0x1C, 0x1D, 0x1E, 0x1F, 0x0B, 0x0C, 0x20, 0x0A, 0x0D, 0x09, 0x3000,
           0xFEFF, 0x2060]
    corpus = []
    for _ in range(count):
        chars = []
        for _ in range(rng.randint(1, 40)):
            r = rng.random()
            cp = rng.randint(0x20, 0xFFFF) if r < 0.5 else rng.randint(0x10000, 0x3FFFF) if r < 0.8 else rng.choice(odd)
            chars.append(chr(0x41 if 0xD800 <= cp <= 0xDFFF else cp))  # no lone surrogates
        corpus.append("".join(chars))
    return corpus


def run_cpp(mmtrain_bin: str, tokenizer: str, corpus: list[str], tmp_path, tag: str, *flags: str):
    strings = tmp_path / f"{tag}_strings.jsonl"
    out = tmp_path / f"{tag}_ids.jsonl"
    with open(strings, "w", encoding="utf-8") as f:
        for s in corpus:
            f.write(json.dumps(s) + "\n")
    subprocess.run([mmtrain_bin, "debug", "tokenize", "--tokenizer", str(tokenizer), "--in", str(strings),
                    "--out", str(out), *flags], check=True, timeout=600)
    with open(out, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == len(corpus)
    return rows


def compare(corpus, rows, ref_encode, ref_decode):
    """Returns (id mismatches, decode mismatches, first failing examples)."""
    bad_ids, bad_text, examples = 0, 0, []
    for s, row in zip(corpus, rows):
        ref = ref_encode(s)
        if row["ids"] != ref:
            bad_ids += 1
            if len(examples) < 3:
                examples.append({"text": s[:80], "cpp": row["ids"][:20], "ref": ref[:20]})
        elif row["text"] != ref_decode(ref):
            bad_text += 1
            if len(examples) < 3:
                examples.append({"text": s[:80], "cpp_decoded": row["text"][:80], "ref_decoded": ref_decode(ref)[:80]})
    return bad_ids, bad_text, examples


@pytest.fixture(scope="module")
def corpus():
    strings = make_corpus()
    assert len(strings) >= 1000
    return strings


@pytest.fixture(scope="module")
def tekken_v13(tmp_path_factory):
    """The shipped tekken file as a v13 file: explicit special_tokens (the 20 defaults + extras)."""
    with open(TEKKEN_FILE, encoding="utf-8") as f:
        data = json.load(f)
    names = DEFAULT_SPECIALS + V13_EXTRA_SPECIALS
    data["special_tokens"] = [{"rank": i, "token_str": n, "is_control": True} for i, n in enumerate(names)]
    data["config"]["version"] = "v13"
    path = tmp_path_factory.mktemp("tok") / "tekken_v13.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return path


def bytes_to_unicode() -> dict[int, str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@pytest.fixture(scope="module")
def hf_file(tmp_path_factory, tekken_v13):
    """A Mistral-style byte-level BPE tokenizer.json derived from the tekken ranks."""
    tk = Tekkenizer.from_file(str(tekken_v13))
    num_special = tk.num_special_tokens
    with open(tekken_v13, encoding="utf-8") as f:
        data = json.load(f)
    inner = tk.n_words - num_special
    to_char = bytes_to_unicode()
    pieces = ["".join(to_char[b] for b in base64.b64decode(t["token_bytes"])) for t in data["vocab"][:inner]]
    vocab = {}
    specials = [tk.id_to_piece(i) for i in range(num_special)]
    for i, name in enumerate(specials):
        vocab[name] = i
    for rank, piece in enumerate(pieces):
        vocab[piece] = rank + num_special
    # Merges from ranks: every split of a token into two tokens, ordered by the merged token's
    # rank, then by the parts' ranks (what transformers' tekken converter does).
    merges = []
    for rank, piece in enumerate(pieces):
        if rank < 256:
            continue
        local = [(vocab[piece[:k]], vocab[piece[k:]], piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab and vocab[piece[:k]] >= num_special
                 and vocab[piece[k:]] >= num_special]
        merges += [[left, right] for _, _, left, right in sorted(local)]
    tokenizer_json = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, name in enumerate(specials)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tokenizer_json, f, ensure_ascii=False)
    return path


def hf_reference(path, fix_mistral_regex=False, split_special_tokens=False) -> Tokenizer:
    tok = Tokenizer.from_file(str(path))
    if fix_mistral_regex:  # transformers' _patch_mistral_regex on a Sequence pre-tokenizer
        tok.pre_tokenizer[0] = pre_tokenizers.Split(pattern=Regex(TEKKEN_REGEX), behavior="isolated")
    tok.encode_special_tokens = split_special_tokens
    return tok


@pytest.mark.parametrize("which", ["shipped_v3", "v13_special_tokens"])
def test_tekken_matches_mistral_common(mmtrain_bin, corpus, tekken_v13, tmp_path, parity_report, which):
    path = TEKKEN_FILE if which == "shipped_v3" else tekken_v13
    tk = Tekkenizer.from_file(str(path))
    rows = run_cpp(mmtrain_bin, path, corpus, tmp_path, which, "--format", "tekken")
    bad_ids, bad_text, examples = compare(corpus, rows, lambda s: tk.encode(s, bos=False, eos=False), tk.decode)
    tokens = sum(len(r["ids"]) for r in rows)
    parity_report(f"tokenizer tekken ({which}, {os.path.basename(str(path))}): {len(corpus)} strings, {tokens} ids, "
                  f"id mismatches {bad_ids}, decode mismatches {bad_text}")
    assert (bad_ids, bad_text) == (0, 0), examples
    # Control-token look-alikes in user text never become control ids.
    for s, row in zip(corpus, rows):
        assert all(i >= tk.num_special_tokens for i in row["ids"]), s


@pytest.mark.parametrize("mode", ["as_shipped", "fix_mistral_regex", "fix_mistral_regex+split_special_tokens"])
def test_hf_bpe_matches_tokenizers(mmtrain_bin, corpus, hf_file, tmp_path, parity_report, mode):
    fix = mode.startswith("fix")
    split = mode.endswith("split_special_tokens")
    flags = ["--format", "hf"] + (["--fix-mistral-regex"] if fix else []) + (["--split-special-tokens"] if split else [])
    rows = run_cpp(mmtrain_bin, hf_file, corpus, tmp_path, mode.replace("+", "_"), *flags)
    ref = hf_reference(hf_file, fix, split)
    bad_ids, bad_text, examples = compare(
        corpus, rows, lambda s: ref.encode(s, add_special_tokens=False).ids,
        lambda ids: ref.decode(ids, skip_special_tokens=True))
    parity_report(f"tokenizer hf ({mode}): {len(corpus)} strings, id mismatches {bad_ids}, decode mismatches {bad_text}")
    assert (bad_ids, bad_text) == (0, 0), examples


def test_wide_code_points(mmtrain_bin, hf_file, tmp_path, parity_report):
    corpus = make_wide_corpus()
    tk = Tekkenizer.from_file(TEKKEN_FILE)
    rows = run_cpp(mmtrain_bin, TEKKEN_FILE, corpus, tmp_path, "wide_tekken", "--format", "tekken")
    tekken_bad = compare(corpus, rows, lambda s: tk.encode(s, bos=False, eos=False), tk.decode)
    rows = run_cpp(mmtrain_bin, hf_file, corpus, tmp_path, "wide_hf", "--format", "hf", "--fix-mistral-regex")
    ref = hf_reference(hf_file, fix_mistral_regex=True)
    hf_bad = compare(corpus, rows, lambda s: ref.encode(s, add_special_tokens=False).ids,
                     lambda ids: ref.decode(ids, skip_special_tokens=True))
    parity_report(f"tokenizer wide code points: {len(corpus)} strings, tekken id/decode mismatches "
                  f"{tekken_bad[0]}/{tekken_bad[1]}, hf (fix_mistral_regex) {hf_bad[0]}/{hf_bad[1]}")
    assert tekken_bad[:2] == (0, 0), tekken_bad[2]
    assert hf_bad[:2] == (0, 0), hf_bad[2]


def test_fix_mistral_regex_agrees_with_tekken(mmtrain_bin, corpus, hf_file, tekken_v13, tmp_path, parity_report):
    """The point of fix_mistral_regex: with it (and control strings left as text) the tokenizer.json
    path gives tekken's ids; without it, it does not."""
    tk = Tekkenizer.from_file(str(tekken_v13))
    fixed = run_cpp(mmtrain_bin, hf_file, corpus, tmp_path, "cross_fixed", "--format", "hf", "--fix-mistral-regex",
                    "--split-special-tokens")
    plain = run_cpp(mmtrain_bin, hf_file, corpus, tmp_path, "cross_plain", "--format", "hf", "--split-special-tokens")
    ref = [tk.encode(s, bos=False, eos=False) for s in corpus]
    fixed_bad = sum(r["ids"] != e for r, e in zip(fixed, ref))
    plain_bad = sum(r["ids"] != e for r, e in zip(plain, ref))
    parity_report(f"tokenizer hf vs tekken: {len(corpus)} strings, mismatches with fix_mistral_regex {fixed_bad}, "
                  f"without {plain_bad}")
    assert fixed_bad == 0
    assert plain_bad > 0
