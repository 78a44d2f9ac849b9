"""A literate, tested reference implementation of the LLM inference stack: model, runtime, quantization, speculation, parallelism, serving and fleet"""

__version__ = "0.1.0"

def __getattr__(name):
    "`from inferlab import LLM, SamplingParams, LLMEngine` without importing torch for users of the fleet simulator."
    if name in ("LLM", "LLMEngine", "EngineConfig", "RequestOutput"):
        from .engine import llm_engine
        return getattr(llm_engine, name)
    if name == "SamplingParams":
        from .sampling import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'inferlab' has no attribute {name!r}")
