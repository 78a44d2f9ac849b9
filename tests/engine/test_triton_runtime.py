"""Triton's mode is the caller's explicit choice (chapter 13a): importing the kernel modules sets nothing."""
import json, os, subprocess, sys
import pytest

pytest.importorskip("triton")

def _fresh(code: str) -> dict:
    "Run `code` (which prints one JSON line) in a new Python without TRITON_INTERPRET."
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])

def test_importing_the_kernels_chooses_nothing():
    out = _fresh("import json, os\n"
                 "import inferlab.engine.model_runner, inferlab.engine.triton_attention, inferlab.quant.kernels\n"
                 "from inferlab.engine.triton_runtime import interpreter_ready\n"
                 "print(json.dumps({'env': os.environ.get('TRITON_INTERPRET'), 'interp': interpreter_ready()}))")
    assert out == {"env": None, "interp": False}

def test_switch_before_import_chooses_the_interpreter():
    out = _fresh("import json, os\n"
                 "from inferlab.engine.triton_runtime import use_triton_interpreter, interpreter_ready\n"
                 "use_triton_interpreter()\n"
                 "import inferlab.quant.kernels\n"
                 "print(json.dumps({'env': os.environ.get('TRITON_INTERPRET'), 'interp': interpreter_ready()}))")
    assert out == {"env": "1", "interp": True}
