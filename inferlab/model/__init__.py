"The model layer (chapters 0x): configs, tokenizer, decoder, checkpoint loading, sampling, reference generate, training."
# Written by hand (like nbdev's own __init__.py): the layer's front door, `from inferlab.model import load_model`.
# Lazy, so that torch-free modules of this layer (`inferlab.model.hardware`, used by the fleet simulator) stay torch-free.
_NAMES = {"ModelConfig": "config", "load_config": "config", "CausalLM": "model", "load_model": "model",
          "save_model": "model", "Tokenizer": "tokenizer", "load_tokenizer": "tokenizer"}

def __getattr__(name):
    if name in _NAMES:
        import importlib
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
