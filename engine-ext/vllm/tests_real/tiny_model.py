"""A tiny Llama-architecture model made at test time: nothing is downloaded.

Small enough for two CPU cores (2 layers, hidden 128, 4 query heads over 2 KV heads of 32),
with a byte-level BPE tokenizer trained here by `tokenizers` on a fixed text, a chat template
in ``tokenizer_config.json``, and seeded random safetensors weights. The weights are drawn
far larger than a trained model's initialisation (embeddings N(0, 1), projections
N(0, 0.08)) so that every output logit depends visibly on the attended KV: with vLLM's
``--load-format dummy`` (uniform ±1e-3) the logits are nearly flat and a wrong KV restore
could leave greedy tokens and logprobs unchanged — a test that cannot fail.

The same seed gives the same bytes on every machine (torch's CPU generator), so two
engines, or two runs, serve the same model.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

# Where this tokenizer's words come from: tether's request synthesizer (fleet/src/synth).
SYNTH_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

SPECIAL = ["<|begin|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]

# Role markers around each message; content may be a string or a list of text parts (the
# Responses and Messages APIs hand vLLM parts).
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

# What the tokenizer is trained on: a few agent-like phrases. The vocabulary is small
# (a few hundred tokens), so any text tokenizes into byte-level pieces as well.
CORPUS = [
    "the quick brown fox jumps over the lazy dog ",
    "def main():\n    return run(tool_call, result)\n",
    "agent tool call result user reply assistant system planner verifier ",
    '{"name": "read_file", "arguments": {"path": "src/lib.rs"}} ',
]

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
}


def tokenizer(out: Path) -> int:
    """Train and save the tokenizer; its vocabulary size."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([c * 8 for c in CORPUS], trainer)
    tok.save(str(out / "tokenizer.json"))
    _tokenizer_config(out, CHAT_TEMPLATE)
    return tok.get_vocab_size()


# The demo's tokenizer ("words", `make(..., words=True)`): one whitespace-separated word is
# one token, as tether-rank's simulated tokenizer counts (engine-ext/rank-engine/src/prompt.rs),
# so a replayed trace has the same prompt lengths and block boundaries on the real engine and
# on the simulator. Its vocabulary: the synthesizer's 3,844 two-character words and the
# literals its Chat bodies carry (roles, tool names, call ids); any other word is <|unk|>,
# still one token.
WORD_LITERALS = (["system", "user", "assistant", "tool", "function", "object", "{}", "bash", "Task"]
                 + [f"tool_{i}" for i in range(1, 65)] + [f"call_{i}" for i in range(1000)])

# The Chat body's strings in tether-rank's canonical order: `tools` (per tool: description,
# name, parameter type, type), then `messages` (per message, keys ascending: content, role,
# tool_call_id, tool_calls' {function: {arguments, name}, id, type}); no generation prompt
# (tether-rank counts none). vLLM hands a template tool-call arguments parsed; `tojson`
# writes `{}` back as the one word the body had.
WORD_TEMPLATE = (
    "{% for t in tools or [] %}{{ t['function']['description'] ~ ' ' ~ t['function']['name'] ~ ' '"
    " ~ t['function']['parameters']['type'] ~ ' ' ~ t['type'] ~ ' ' }}{% endfor %}"
    "{% for m in messages %}"
    "{% if m['content'] is string %}{{ m['content'] ~ ' ' }}"
    "{% elif m['content'] %}{% for p in m['content'] %}{{ p['text'] ~ ' ' }}{% endfor %}{% endif %}"
    "{{ m['role'] ~ ' ' }}{% if m['tool_call_id'] %}{{ m['tool_call_id'] ~ ' ' }}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}{{ c['function']['arguments'] | tojson ~ ' ' ~"
    " c['function']['name'] ~ ' ' ~ c['id'] ~ ' ' ~ c['type'] ~ ' ' }}{% endfor %}"
    "{% endfor %}"
)


def word_tokenizer(out: Path) -> int:
    """The word-level tokenizer (see WORD_TEMPLATE); its vocabulary size."""
    words = [a + b for a in SYNTH_ALPHABET for b in SYNTH_ALPHABET]
    vocab = {w: i for i, w in enumerate([*SPECIAL, "<|unk|>", *words, *WORD_LITERALS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(SPECIAL)
    tok.save(str(out / "tokenizer.json"))
    _tokenizer_config(out, WORD_TEMPLATE)
    return tok.get_vocab_size()


def _tokenizer_config(out: Path, template: str) -> None:
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin|>",
        "eos_token": "<|end|>",
        "pad_token": "<|end|>",
        "chat_template": template,
        "model_max_length": LLAMA["max_position_embeddings"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random Llama weights in bf16, named as transformers' LlamaForCausalLM."""
    g = torch.Generator().manual_seed(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]

    def draw(*shape: int, std: float = 0.08) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    ones = torch.ones(h, dtype=torch.bfloat16)
    t = {"model.embed_tokens.weight": draw(v, h, std=1.0), "model.norm.weight": ones.clone(),
         "lm_head.weight": draw(v, h)}
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = ones.clone()
        t[p + "post_attention_layernorm.weight"] = ones.clone()
        for name, shape in (("q_proj", (q, h)), ("k_proj", (kv, h)), ("v_proj", (kv, h)),
                            ("o_proj", (h, q))):
            t[p + f"self_attn.{name}.weight"] = draw(*shape)
        for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i))):
            t[p + f"mlp.{name}.weight"] = draw(*shape)
    return t


def make(out: Path, seed: int = 7, *, words: bool = False, max_len: int | None = None) -> Path:
    """The tiny Llama model in ``out`` (created), with the BPE tokenizer or (``words``) the
    word-level one; ``max_len``: its longest context if not the default; returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(LLAMA, vocab_size=(word_tokenizer if words else tokenizer)(out))
    if max_len is not None:
        cfg["max_position_embeddings"] = max_len
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
