"""pytest setup: the helpers beside these tests, and the Envoy helpers of ../tests."""

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "tests"))

if os.environ.get("TETHER_REQUIRE_GPU") == "1":
    # scripts/vllm-gpu-check.sh real: the suite must run on CUDA vLLM, never fall back to CPU.
    import torch

    assert torch.cuda.is_available(), "TETHER_REQUIRE_GPU=1 but torch sees no CUDA device"
