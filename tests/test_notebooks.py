"Every chapter is a test: run each notebook in nbs/ (cells flagged `slow` or `notest` skipped)."
from pathlib import Path
import pytest
import nbdev.test as nbt   # not `from nbdev.test import test_nb`: pytest would collect it

NBS = sorted(p for p in (Path(__file__).resolve().parents[1] / "nbs").glob("*.ipynb") if not p.name.startswith("_"))

@pytest.mark.parametrize("nb", NBS, ids=[p.stem for p in NBS])
def test_notebook(nb):
    ok, secs = nbt.test_nb(nb, skip_flags=["notest", "slow"])
    assert ok, f"{nb.name} failed: its traceback is printed above"
