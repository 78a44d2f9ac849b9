"""The conversion side of `make bench-llamacpp`: llama.cpp's own `convert_hf_to_gguf.py`, with one mapping added.

    python tools/llamacpp_convert.py LLAMA_CPP_DIR MODEL_DIR OUT.gguf f32|q8_0

llama.cpp must know a BPE tokenizer's pre-tokenizer (the regex that splits text before merging) to tokenize like
the original; its converter recognises a tokenizer by hashing how it encodes a test string, and refuses one it has
not seen ("BPE pre-tokenizer was not recognized"). inferlab's tokenizers are byte-level BPE with the GPT-2 split
pattern (`ByteLevel`, `use_regex: true`, no normaliser), which is llama.cpp's pre-tokenizer type "gpt-2": this script
checks exactly that in `tokenizer.json`, answers "gpt-2", and sends the Llama converter's vocabulary step straight
to its BPE path (it would first try SentencePiece, which a BPE checkpoint has no file for). Any other tokenizer goes
through llama.cpp's own checks unchanged. Run by inferlab's Python (it has torch, numpy and transformers); nothing here is imported by inferlab."""
import json, runpy, sys
from pathlib import Path

def gpt2_byte_level(model_dir: Path) -> bool:
    "Whether `tokenizer.json` splits text exactly as GPT-2 does (byte-level, GPT-2 regex, no normaliser)."
    tok = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    pre = tok.get("pre_tokenizer") or {}
    return (tok.get("normalizer") is None and tok.get("model", {}).get("type") == "BPE"
            and pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space"))

def main(llama_cpp: str, model_dir: str, out: str, outtype: str):
    root = Path(llama_cpp)
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    import conversion.base as base, conversion.llama as llama          # llama.cpp's converter package
    if gpt2_byte_level(Path(model_dir)):
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
        llama.LlamaModel.set_vocab = base.TextModel._set_vocab_gpt2
    sys.argv = ["convert_hf_to_gguf.py", model_dir, "--outfile", out, "--outtype", outtype]
    runpy.run_path(str(root / "convert_hf_to_gguf.py"), run_name="__main__")

if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[4] not in ("f32", "f16", "bf16", "q8_0"):
        sys.exit(__doc__.split("\n\n")[1])
    main(*sys.argv[1:])
