"""A literate, tested reference implementation of the LLM inference stack: model, runtime, quantization, speculation, parallelism, serving and fleet"""

__version__ = "0.1.0"

def __getattr__(name):
    "`from inferlab import LLM, SamplingParams, LLMEngine` without importing torch for users of the fleet simulator."
    if name == "LLM":
        from .llm import LLM
        return LLM
    if name in ("LLMEngine", "EngineConfig", "RequestOutput"):
        from .engine import llm_engine
        return getattr(llm_engine, name)
    if name == "SamplingParams":
        from .model.sampling import SamplingParams
        return SamplingParams
    if name in ("load_model", "load_tokenizer"):
        from . import model
        return getattr(model, name)
    raise AttributeError(f"module 'inferlab' has no attribute {name!r}")
