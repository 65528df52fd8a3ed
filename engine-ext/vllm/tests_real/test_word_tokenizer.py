"""The assumption `make demo-vllm`'s simulator check rests on: the tiny model's word-level
tokenizer and chat template count a synthesized Chat body exactly as tether-rank's simulated
tokenizer does, so the trace's `input_tokens` are the engine's prompt tokens too.

The bodies are the replayer's own (``tether trace synth``), tools and tool calls included;
the template is rendered as vLLM renders it (tool-call arguments parsed to objects first)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import tiny_model
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[3]
CLI = os.environ.get("TETHER_CLI", str(ROOT / "target/debug/tether"))


def bodies(trace: Path, limit: int) -> list[dict]:
    out = subprocess.run([CLI, "trace", "synth", str(trace), "--limit", str(limit)],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def input_tokens(trace: Path) -> list[int]:
    rows = (json.loads(line) for line in trace.read_text().splitlines() if line.strip())
    return [r["input_tokens"] for r in rows if r["type"] == "request"]


def as_vllm_hands_them(messages: list[dict]) -> list[dict]:
    """vLLM parses each tool call's JSON ``arguments`` before rendering the template."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [dict(c, function=dict(c["function"], arguments=json.loads(
                c["function"]["arguments"]))) for c in m["tool_calls"]]
        out.append(m)
    return out


def test_a_synthesized_chat_body_counts_as_tether_rank_counts(tmp_path: Path) -> None:
    model = tiny_model.make(tmp_path / "model", words=True)
    tok = PreTrainedTokenizerFast.from_pretrained(str(model))
    trace = ROOT / "examples/traces/agent-demo.jsonl"
    sent = bodies(trace, 40)
    expected = input_tokens(trace)
    assert len(sent) == 40
    kinds = set()
    for req in sent:
        body = req["body"]
        ids = tok.apply_chat_template(as_vllm_hands_them(body["messages"]), tools=body.get("tools"),
                                      tokenize=True, add_generation_prompt=True)
        if hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        i = sent.index(req)
        assert len(ids) == expected[i], (i, req["opened_by"], len(ids), expected[i])
        assert tok.unk_token_id not in ids, i
        kinds.update(m["role"] for m in body["messages"])
    # Every message shape the template walks was exercised.
    assert {"system", "user", "assistant", "tool"} <= kinds
