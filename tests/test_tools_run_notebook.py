"tools/run_notebook.py: what a chapter builds is gone once it has run (the chapters run one after another in a test worker and in the docs build)."
import builtins, json, sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from run_notebook import run_notebook

CELL = """import builtins, weakref
class Big: pass
big = Big(); big.data = bytearray(10_000_000)
builtins._probe.append(weakref.ref(big))
def keep(): return big          # a closure over the namespace, as a widget's callback is"""

def test_a_chapters_objects_are_released(tmp_path):
    nb = dict(cells=[dict(cell_type="code", id="probe", metadata={}, source=CELL, outputs=[], execution_count=None)],
              metadata={"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
              nbformat=4, nbformat_minor=5)
    path = tmp_path / "probe.ipynb"
    path.write_text(json.dumps(nb))
    builtins._probe = []
    try:
        for _ in range(3): assert run_notebook(path, [])[0]
        assert len(builtins._probe) == 3 and all(r() is None for r in builtins._probe)
    finally: del builtins._probe
