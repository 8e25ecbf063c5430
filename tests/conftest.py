"""Shared test setup: nothing a test does may touch the real ~/.evotrainer (the skill library lives there)."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep: 2 shared cores


@pytest.fixture(autouse=True, scope="session")
def _isolated_home():
    old = os.environ.get("EVOTRAINER_HOME")
    with tempfile.TemporaryDirectory(prefix="evotrainer-test-home-") as d:
        os.environ["EVOTRAINER_HOME"] = d
        yield
    if old is None:
        os.environ.pop("EVOTRAINER_HOME", None)
    else:
        os.environ["EVOTRAINER_HOME"] = old
