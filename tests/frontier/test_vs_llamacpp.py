"""`make bench-llamacpp`'s conversion step (chapter 71a) against a stand-in llama.cpp tree (CI builds no llama.cpp):
tools/llamacpp_convert.py must answer "gpt-2" for the shipped byte-level tokenizer and send the Llama converter to
its BPE path, leave other tokenizers to llama.cpp's own check, and `gguf_convert` must report a failed conversion."""
import json, shutil, sys
from pathlib import Path
import pytest
from inferlab.model.config import shipped_model_path
from inferlab.frontier.vs_llamacpp import gguf_convert

SCRIPT = str(Path(__file__).resolve().parents[2] / "tools" / "llamacpp_convert.py")

def fake_llama_cpp(root: Path) -> Path:
    "A converter with llama.cpp's shape: conversion.base.TextModel, conversion.llama.LlamaModel, a main script."
    (root / "conversion").mkdir(parents=True); (root / "gguf-py").mkdir()
    (root / "conversion" / "__init__.py").write_text("")
    (root / "conversion" / "base.py").write_text(
        "class TextModel:\n"
        "    def get_vocab_base_pre(self, tokenizer):\n"
        "        raise NotImplementedError('BPE pre-tokenizer was not recognized')\n"
        "    def _set_vocab_gpt2(self):\n"
        "        self.vocab = ('bpe', self.get_vocab_base_pre(None))\n")
    (root / "conversion" / "llama.py").write_text(
        "from conversion.base import TextModel\n"
        "class LlamaModel(TextModel):\n"
        "    def set_vocab(self):\n"
        "        raise ModuleNotFoundError(\"No module named 'sentencepiece'\")\n")
    (root / "convert_hf_to_gguf.py").write_text(
        "import json, sys\nfrom conversion.llama import LlamaModel\n"
        "m = LlamaModel(); m.set_vocab()\n"
        "out = sys.argv[sys.argv.index('--outfile') + 1]\n"
        "open(out, 'w').write(json.dumps(dict(vocab=m.vocab, outtype=sys.argv[-1])))\n")
    return root

def test_shipped_tokenizer_maps_to_gpt2_and_bpe(tmp_path):
    out = gguf_convert(fake_llama_cpp(tmp_path / "llama.cpp"), shipped_model_path("tiny-dense"), tmp_path / "t.gguf",
                       "q8_0", script=SCRIPT)
    assert json.loads(out.read_text()) == {"vocab": ["bpe", "gpt-2"], "outtype": "q8_0"}

def test_other_tokenizers_meet_llama_cpps_own_check(tmp_path):
    model = tmp_path / "model"; shutil.copytree(shipped_model_path("tiny-dense"), model)
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["pre_tokenizer"]["use_regex"] = False                 # another split: not GPT-2's, so no mapping
    (model / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(RuntimeError, match="sentencepiece"):  # llama.cpp's own path, and its own failure, reported
        gguf_convert(fake_llama_cpp(tmp_path / "llama.cpp"), model, tmp_path / "t.gguf", script=SCRIPT)

def test_missing_sources_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="make bench-llamacpp"):
        gguf_convert(tmp_path / "nowhere", shipped_model_path("tiny-dense"), tmp_path / "t.gguf", script=SCRIPT)
