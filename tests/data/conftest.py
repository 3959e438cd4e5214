"""Tests on the real datasets in ../shared/datasets; skipped when that folder is absent."""

from pathlib import Path

import pytest

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@pytest.fixture(scope="session")
def datasets() -> Path:
    if not DATASETS.is_dir():
        pytest.skip(f"real datasets not found at {DATASETS} (clone beside ../shared to run)")
    return DATASETS
