"""pytest setup for the model-level tests: import paths and the autofusion binary under test.

Invariant: the binary comes from $AF_BIN (default <repo>/build/autofusion); when it is missing the
tests fail rather than skip, because CI builds it before running them.
"""

import os
import sys

import pytest
import torch

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
for sub in ("python", "bench", "tools"):
    sys.path.insert(0, os.path.join(REPO, sub))

import autofusion_cli  # noqa: E402

# The torch side is the oracle, not the thing being timed: two threads match the CI machine and
# keep torch from competing with the binary under test for more cores than exist.
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def af_bin():
    path = autofusion_cli.default_binary()
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        pytest.fail(f"autofusion binary not found at {path}: build it first "
                    "(cmake -S . -B build && cmake --build build) or set AF_BIN", pytrace=False)
    return path
