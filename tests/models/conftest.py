"""The models tests run in the lab home of the tiny model trained once per session
(`trained` and `loaded`, in tests/conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest



@pytest.fixture(autouse=True)
def models_home(trained, monkeypatch) -> Path:
    monkeypatch.setenv("LAB_HOME", str(trained.home))
    return trained.home
