"""Every chapter is a test: run each notebook in nbs/ (cells flagged `slow` or `notest` skipped). One class per
layer (decade of chapters), so that `pytest -n 2 --dist loadscope` (the README's command) spreads the layers over
workers while each layer's chapters run in order in one process."""
import gc
from pathlib import Path
import pytest
import nbdev.test as nbt   # not `from nbdev.test import test_nb`: pytest would collect it

NBS = sorted(p for p in (Path(__file__).resolve().parents[1] / "nbs").glob("*.ipynb") if not p.name.startswith("_"))

def _layer(nb: Path) -> str:
    return f"{nb.name[0]}x" if nb.name[0].isdigit() else "index"

def _release(main):
    """Drop what a chapter left behind in this process. The notebook ran in an IPython shell whose namespace is a
    `__main__` module that stays in sys.modules, and the shell stays registered as IPython's instance: without a reset,
    every engine a chapter built (and its KV cache) lived on for the rest of the layer, and a worker grew to 16 GiB."""
    import sys, ipywidgets, matplotlib.pyplot as plt
    from IPython.core.interactiveshell import InteractiveShell
    ipywidgets.Widget.close_all()
    plt.close("all")
    shell = InteractiveShell._instance
    if shell is not None:
        shell.reset(new_session=False)     # clears the user namespace, Out and the output cache
        if getattr(shell, "loop", None) is not None: shell.loop.call_soon_threadsafe(shell.loop.stop)
        InteractiveShell.clear_instance()
    sys.modules["__main__"] = main
    gc.collect()

def _run(nb: Path):
    import sys
    main = sys.modules["__main__"]
    try: ok, secs = nbt.test_nb(nb, skip_flags=["notest", "slow"])
    finally: _release(main)
    assert ok, f"{nb.name} failed: its traceback is printed above"

def _chapter_class(layer: str, nbs: list[Path]):
    @pytest.mark.parametrize("nb", nbs, ids=[p.stem for p in nbs])
    def test_notebook(self, nb): _run(nb)
    return type(f"TestChapters{layer}", (), {"test_notebook": test_notebook, "__doc__": f"Chapters {layer}."})

for _l in dict.fromkeys(map(_layer, NBS)):
    globals()[f"TestChapters{_l}"] = _chapter_class(_l, [p for p in NBS if _layer(p) == _l])
