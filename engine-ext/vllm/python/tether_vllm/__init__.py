"""tether's KV connector for vLLM: turn-boundary retention, a checksummed host tier,
and tether's KV-copy engine moving the pages (docs/vllm.md)."""

from tether_vllm._native import (
    RESIDENCY_MAX_ENTRIES,
    CallerError,
    DeviceError,
    KvCopier,
    Ledger,
    Marker,
    TetherError,
    TransientError,
    cuda_available,
    load_report,
    parse_marker,
    read_load_report,
)

__all__ = [
    "RESIDENCY_MAX_ENTRIES",
    "CallerError",
    "DeviceError",
    "KvCopier",
    "Ledger",
    "Marker",
    "TetherConnector",
    "TetherError",
    "TransientError",
    "cuda_available",
    "load_report",
    "parse_marker",
    "read_load_report",
]


def __getattr__(name):
    # The connector imports vLLM; load it only when asked for, so the policy and copy
    # engine work without vLLM installed (the GPU script, tools).
    if name == "TetherConnector":
        from tether_vllm.connector import TetherConnector

        return TetherConnector
    raise AttributeError(name)
