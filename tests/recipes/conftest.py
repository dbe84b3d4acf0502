"""The recipe tests' own lab home: their runs, fits and plots must not show up in the other
tests' registry (the calculator would take them for measured speeds)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def recipe_home(tmp_path_factory, lab_home) -> Path:
    before = os.environ["LAB_HOME"]
    home = tmp_path_factory.mktemp("recipe-home")
    os.environ["LAB_HOME"] = str(home)
    try:
        yield home
    finally:
        os.environ["LAB_HOME"] = before


@pytest.fixture(scope="module")
def recipe_data(recipe_home) -> Path:
    """The `pydoc` constellation prepared in the recipe home with a small vocabulary."""
    from lab import corpus
    return corpus.prepare(["pydoc"], vocab=512, progress=False)
