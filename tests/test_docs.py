"""The generated docs are up to date with the data they are generated from."""
from pathlib import Path

import pytest

from rlk_triton import docgen

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("rel", sorted(docgen.GENERATED))
def test_generated_doc_is_current(rel):
    assert (ROOT / rel).read_text() == docgen.GENERATED[rel](), f"run: python -m rlk_triton.docgen ({rel})"
