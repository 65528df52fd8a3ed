"""A tiny hybrid model made at test time: Qwen3-Next (``Qwen3NextForCausalLM``), Gated DeltaNet linear-attention layers beside full-attention layers — the class
the shipped hybrid profile models. Nothing is downloaded. (Qwen3.5's dense
``Qwen3_5ForCausalLM`` is the same layers, but vLLM 0.32's ``qwen3_5.py`` imports its
vision model, which needs torchvision, not in .venv-engine.)

Two layers, hidden 128: layer 0 a Gated DeltaNet (2 key heads, 4 value heads of 32, conv
kernel 4) with a dense MLP, layer 1 gated full attention (4 query heads over 2 KV heads of
32) with Qwen3-Next's sparse MoE block (2 experts, top-1, and the gated shared expert):
vLLM's Qwen3-Next needs at least one MoE layer (``set_moe_parameters``). The tokenizer is ``tiny_model``'s (trained offline, same chat template). The
weights are seeded and drawn as large as ``tiny_model``'s so every logit depends visibly on
the restored KV and the restored linear state. The decay (``A_log``) is drawn small, so the
recurrent state carries the last hundred tokens or so into the next one: a state page
restored wrong, or not at all, changes the first tokens after it.

Weight names and shapes are transformers' ``Qwen3NextForCausalLM`` (what vLLM's loader
reads): ``linear_attn.in_proj_qkvz`` / ``in_proj_ba`` (fused), ``conv1d``, ``A_log``,
``dt_bias``, a gated ``norm`` and ``out_proj``; ``self_attn.q_proj`` twice the query width
(query and output gate) and per-head ``q_norm`` / ``k_norm``; the MoE block's router
``mlp.gate``, per-expert ``mlp.experts.E.{gate,up,down}_proj`` (the checkpoint layout vLLM's
FusedMoE loader maps), ``mlp.shared_expert`` and ``mlp.shared_expert_gate``. Qwen3-Next's RMSNorms scale by ``1 + weight`` (zeros are identity) but the DeltaNet's gated norm, which
scales by ``weight`` (ones).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tiny_model import tokenizer

QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "layer_types": ["linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_num_key_heads": 1,
    "linear_num_value_heads": 1,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
    "num_experts": 2,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "mlp_only_layers": [0],
    "decoder_sparse_step": 1,
    "norm_topk_prob": True,
    "hidden_act": "silu",
    "max_position_embeddings": 16384,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "partial_rotary_factor": 0.25,
    "attention_bias": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
}


def weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded random weights in bf16, named as transformers' Qwen3NextForCausalLM."""
    g = torch.Generator().manual_seed(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    lk = cfg["linear_num_key_heads"] * cfg["linear_key_head_dim"]
    lv_heads = cfg["linear_num_value_heads"]
    lv = lv_heads * cfg["linear_value_head_dim"]
    conv = 2 * lk + lv  # the convolution runs over q, k and v

    def draw(*shape: int, std: float = 0.08) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16)

    def zeros(n: int) -> torch.Tensor:
        return torch.zeros(n, dtype=torch.bfloat16)

    t = {"model.embed_tokens.weight": draw(v, h, std=1.0), "model.norm.weight": zeros(h),
         "lm_head.weight": draw(v, h)}
    for n, kind in enumerate(cfg["layer_types"]):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = zeros(h)
        t[p + "post_attention_layernorm.weight"] = zeros(h)
        if n in cfg["mlp_only_layers"]:
            t.update(_mlp(p + "mlp.", h, i, draw))
        else:
            m, e = cfg["moe_intermediate_size"], cfg["num_experts"]
            t[p + "mlp.gate.weight"] = draw(e, h)
            for x in range(e):
                t.update(_mlp(p + f"mlp.experts.{x}.", h, m, draw))
            t.update(_mlp(p + "mlp.shared_expert.", h, cfg["shared_expert_intermediate_size"], draw))
            t[p + "mlp.shared_expert_gate.weight"] = draw(1, h)
        if kind == "full_attention":
            a = p + "self_attn."
            for name, shape in (("q_proj", (2 * q, h)), ("k_proj", (kv, h)), ("v_proj", (kv, h)),
                                ("o_proj", (h, q))):
                t[a + f"{name}.weight"] = draw(*shape)
            t[a + "q_norm.weight"] = zeros(d)
            t[a + "k_norm.weight"] = zeros(d)
            continue
        a = p + "linear_attn."
        for name, shape in (("in_proj_qkvz", (conv + lv, h)), ("in_proj_ba", (2 * lv_heads, h)),
                            ("out_proj", (h, lv))):
            t[a + f"{name}.weight"] = draw(*shape)
        t[a + "conv1d.weight"] = draw(conv, 1, cfg["linear_conv_kernel_dim"], std=0.5)
        t[a + "norm.weight"] = torch.ones(cfg["linear_value_head_dim"], dtype=torch.bfloat16)
        # Slow decay (exp(A_log) in [0.01, 0.1]): the state remembers far back.
        t[a + "A_log"] = (torch.rand(lv_heads, generator=g) * 0.09 + 0.01).log()
        t[a + "dt_bias"] = torch.ones(lv_heads)
    return t


def _mlp(p: str, h: int, i: int, draw) -> dict[str, torch.Tensor]:
    return {p + f"{name}.weight": draw(*shape)
            for name, shape in (("gate_proj", (i, h)), ("up_proj", (i, h)), ("down_proj", (h, i)))}


def make(out: Path, seed: int = 11) -> Path:
    """The tiny hybrid model in ``out`` (created); returns ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    cfg = dict(QWEN3_NEXT, vocab_size=tokenizer(out))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file(weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


if __name__ == "__main__":
    print(make(Path(sys.argv[1])))
