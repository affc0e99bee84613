"""Chat template parity: mmtrain's "huggingface" dataset + "pixtral" collator against mistral-common.

Contract:
  * Oracle: mistral-common's InstructTokenizerV13 (MistralTokenizer.from_file on the shipped
    tekken_240911.json turned into a v13 file with an explicit special_tokens list, as in
    test_tokenizer_parity) encoding InstructRequest(messages) of text-only conversations:
    <s>[SYSTEM_PROMPT]..[/SYSTEM_PROMPT][INST]..[/INST]answer</s>... . Labels oracle: a token is
    supervised iff it lies after an [/INST] up to and including the next </s> (tekken never turns
    text into control ids, so the scan is exact).
  * mmtrain: the conversations as a "messages" JSONL, cutoff_len 0 (no truncation), one padded
    micro-batch from `mmtrain debug collate`; each row's unpadded ids must equal the oracle's
    exactly, labels likewise, attention_mask 1 exactly on the row's tokens.
  * Conversations cover: with and without system prompt, 1-3 turns, trailing spaces in answers
    (mistral-common strips them), control-token look-alikes in user text, CJK/emoji/code.
"""
import json
import subprocess

from mistral_common.protocol.instruct.messages import AssistantMessage, SystemMessage, UserMessage
from mistral_common.protocol.instruct.request import InstructRequest
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from safetensors.torch import load_file

from test_tokenizer_parity import tekken_v13  # noqa: F401 (the fixture: tekken_240911 as a v13 file)

INST_END, EOS = 4, 2

USERS = ["Hi there", "What is 12345 * 678?", "[INST] is plain text here, so is </s> and [IMG]",
         "日本語で答えてください。", "emoji 🧑🏽‍💻 and flags 🇫🇷", "def f(x):\n    return x ** 2\n",
         "  leading spaces and\ttabs", "Multi\nline\n\nquestion?"]
ANSWERS = ["Hello!", "8369910.", "Understood.   ", "はい。", "👍", "It squares x.", "ok", "Done.\n"]
SYSTEMS = ["", "You are a helpful assistant.", "Réponds en français. "]


def conversations():
    out = []
    for i in range(24):
        system = SYSTEMS[i % len(SYSTEMS)]
        turns = [(USERS[(i + k) % len(USERS)], ANSWERS[(i * 3 + k) % len(ANSWERS)]) for k in range(1 + i % 3)]
        out.append((system, turns))
    return out


def oracle(tokenizer, system, turns):
    messages = ([SystemMessage(content=system)] if system else [])
    for user, answer in turns:
        messages += [UserMessage(content=user), AssistantMessage(content=answer)]
    ids = tokenizer.instruct_tokenizer.encode_instruct(InstructRequest(messages=messages)).tokens
    labels, supervised = [], False
    for t in ids:
        labels.append(t if supervised else -100)
        if t == INST_END:
            supervised = True
        elif t == EOS:
            supervised = False
    return ids, labels


def test_chat_template_matches_mistral_common(mmtrain_bin, tekken_v13, tmp_path, parity_report):
    convs = conversations()
    data = tmp_path / "chat.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for system, turns in convs:
            messages = ([{"role": "system", "content": system}] if system else [])
            for user, answer in turns:
                messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    config = tmp_path / "chat.yaml"
    config.write_text(f"""
model:
  model_id: mistral3
  config:
    text_config: {{vocab_size: 131072, hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 8, intermediate_size: 48}}
    vision_config: {{hidden_size: 16, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 24, patch_size: 4, image_size: 32, hidden_act: silu}}
data:
  dataset_param:
    dataset_type: huggingface
    preprocess_parameters: {{model_name_or_path: {tekken_v13}}}
    basic_parameters: {{template: mistral, dataset: {data}, cutoff_len: 0}}
  dataloader_param: {{collator_id: pixtral}}
training: {{micro_batch_size: {len(convs)}, train_iters: 1}}
""")
    out = tmp_path / "batch.safetensors"
    subprocess.run([mmtrain_bin, "debug", "collate", str(config), "--out", str(out)], check=True,
                   capture_output=True, text=True)
    batch = load_file(str(out))
    tokenizer = MistralTokenizer.from_file(str(tekken_v13))
    mismatches = 0
    for row, (system, turns) in enumerate(convs):
        ids, labels = oracle(tokenizer, system, turns)
        n = len(ids)
        got_ids = batch["input_ids"][row].tolist()
        got_labels = batch["labels"][row].tolist()
        mask = batch["attention_mask"][row].tolist()
        ok = (got_ids[:n] == ids and got_labels[:n] == labels and mask == [1] * n + [0] * (len(mask) - n)
              and all(x == -100 for x in got_labels[n:]))
        mismatches += not ok
        assert ok, f"conversation {row}: mmtrain {got_ids[:n]} / {got_labels[:n]}\n oracle {ids} / {labels}"
    parity_report(f"chat template vs mistral-common InstructTokenizerV13: {len(convs)} conversations, "
                  f"{sum(len(t) for _, t in convs)} turns, {mismatches} mismatches (ids and labels)")
