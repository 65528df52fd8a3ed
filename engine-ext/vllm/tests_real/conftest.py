"""pytest setup: the helpers beside these tests, and the Envoy helpers of ../tests."""

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "tests"))
