"""Tiny random-weight models for the real-engine tests, made here, never downloaded.

Run with the engines' interpreter (it needs torch, transformers, tokenizers, gguf)::

    .venv-engines/bin/python tests/e2e/engines/make_models.py OUT_DIR

It writes ``OUT_DIR/hf/`` (a Llama-architecture model in safetensors with a
word-level ``tokenizer.json`` and a chat template, for Transformers Serve) and
``OUT_DIR/tiny.gguf`` (the same shape as GGUF with a SentencePiece-style vocabulary,
for llama.cpp). With ``--vllm`` it writes only ``OUT_DIR/hf/``, wider (hidden 256,
head size 64: vLLM's CPU attention kernels take usual head sizes, not 16), with
vLLM's interpreter (``.venv-vllm``, which has no gguf). Both vocabularies hold
servemon's word list, so a prompt of N words is N tokens (plus the template's own)
in every engine, and the models are a few MB.
Weights are seeded, so a run is reproducible; what the models write is noise.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

# Small enough to run fast on one CPU core, large enough for real batching paths.
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
FFN = 128
#: vLLM's shape: its CPU attention wants a head size of 64 (or another usual one).
VLLM_HIDDEN = 256
VLLM_FFN = 512
CONTEXT = 4096
SPECIALS = ("<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|> ' + message['content'] + ' <|end|> ' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def vocabulary() -> list[str]:
    """Special tokens, then servemon's word list (the load generator's words)."""
    # Read by path: this interpreter has none of servemon's dependencies.
    source = Path(__file__).resolve().parents[3] / "loadgen" / "workloads" / "tokens.py"
    text = source.read_text(encoding="utf-8")
    lists = [
        match.group(1).split()
        for match in re.finditer(r'_TEXT = """(.*?)"""', text, re.DOTALL)
    ]

    words: list[str] = []
    for word in (
        *[w for words_ in lists for w in words_],
        *"abcdefghijklmnopqrstuvwxyz",
    ):
        if word not in words:
            words.append(word)
    return [*SPECIALS, *words]


def make_hf(out: Path, vocab: list[str], hidden: int = HIDDEN, ffn: int = FFN) -> None:
    """A LlamaForCausalLM with random weights and a word-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    ids = {token: i for i, token in enumerate(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["</s>"],
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.do_sample = False
    model.save_pretrained(out)


def make_gguf(path: Path, vocab: list[str]) -> None:
    """The same shape as GGUF, with an SPM vocabulary llama.cpp tokenizes word-wise.

    Every word is a ``▁word`` piece, and so is each of its prefixes (``▁a``,
    ``▁al``, …) with a score that grows with length: llama.cpp's SPM tokenizer
    merges from characters by score, so these chains lead to the whole word.
    """
    import gguf

    rng = np.random.default_rng(0)
    head_dim = HIDDEN // HEADS
    pieces: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    seen: set[str] = set()

    def add(piece: str, score: float, kind: int) -> None:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
            scores.append(score)
            types.append(kind)

    normal = int(gguf.TokenType.NORMAL)
    for special in SPECIALS:
        kind = gguf.TokenType.UNKNOWN if special == "<unk>" else gguf.TokenType.CONTROL
        add(special, 0.0, int(kind))
    for byte in range(256):
        add(f"<0x{byte:02X}>", 0.0, int(gguf.TokenType.BYTE))
    add("▁", -1000.0, normal)
    for char in "abcdefghijklmnopqrstuvwxyz|<>":
        add(char, -1000.0, normal)
    for word in vocab[len(SPECIALS) :]:
        for end in range(1, len(word) + 1):
            add("▁" + word[:end], float(end), normal)
    n_vocab = len(pieces)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("servemon-tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(pieces.index("<s>"))
    writer.add_eos_token_id(pieces.index("</s>"))
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, HIDDEN))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, HIDDEN))
    for i in range(LAYERS):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"{blk}.attn_q.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{blk}.attn_k.weight", weight(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{blk}.attn_v.weight", weight(KV_HEADS * head_dim, HIDDEN))
        writer.add_tensor(f"{blk}.attn_output.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(FFN, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(FFN, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(HIDDEN, FFN))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main() -> None:
    out = Path(sys.argv[1])
    vocab = vocabulary()
    if sys.argv[2:] == ["--vllm"]:
        make_hf(out / "hf", vocab, hidden=VLLM_HIDDEN, ffn=VLLM_FFN)
        (out / "models.json").write_text(json.dumps({"hf": str(out / "hf")}) + "\n")
        return
    make_hf(out / "hf", vocab)
    make_gguf(out / "tiny.gguf", vocab)
    (out / "models.json").write_text(
        json.dumps({"hf": str(out / "hf"), "gguf": str(out / "tiny.gguf")}) + "\n"
    )


if __name__ == "__main__":
    main()
