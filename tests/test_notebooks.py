"""Every chapter is a test: run each notebook in nbs/ (cells flagged `slow` or `notest` skipped). One class per
layer (decade of chapters), so that `pytest -n 2 --dist loadscope` (the README's command) spreads the layers over
workers while each layer's chapters run in order in one process."""
import sys
from pathlib import Path
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from run_notebook import run_notebook

NBS = sorted(p for p in (ROOT / "nbs").glob("*.ipynb") if not p.name.startswith("_"))

def _layer(nb: Path) -> str:
    return f"{nb.name[0]}x" if nb.name[0].isdigit() else "index"

def _run(nb: Path):
    ok, secs = run_notebook(nb, ["notest", "slow"])
    assert ok, f"{nb.name} failed: its traceback is printed above"

def _chapter_class(layer: str, nbs: list[Path]):
    @pytest.mark.parametrize("nb", nbs, ids=[p.stem for p in nbs])
    def test_notebook(self, nb): _run(nb)
    return type(f"TestChapters{layer}", (), {"test_notebook": test_notebook, "__doc__": f"Chapters {layer}."})

for _l in dict.fromkeys(map(_layer, NBS)):
    globals()[f"TestChapters{_l}"] = _chapter_class(_l, [p for p in NBS if _layer(p) == _l])
