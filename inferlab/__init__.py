"""A literate, tested reference implementation of the LLM inference stack: model, runtime, quantization, speculation, parallelism, serving and fleet

Modules:

- `inferlab.engine.kv_connector`: One interface for every place KV blocks live or travel besides the engine's own pool: a tier in host memory or on disk, another engine across a process boundary. The engine asks it four things at four fixed points of a step.
- `inferlab.engine.kv_tiers`: Blocks the pool evicts are copied to host memory and to disk, and come back instead of being recomputed: the memory arithmetic, transfer against recompute, a multi-turn chat with a pool too small for it, a restart that starts warm, and what can go wrong with files.
- `inferlab.engine.structured`: A grammar becomes a mask over the vocabulary at every step: JSON that parses, a string from a list, a regex, a tool call that matches its schema. The automaton, its cost per step, what tokens do to it, and where it sits in the engine step.
- `inferlab.frontier.structured_bench`: The step time of a batch whose every request is constrained by a JSON schema, against the same batch free, at batch 1 and at a full batch: the grammar mask's price in the engine step, as `inferlab bench` prints it.
- `inferlab.serve.structured_api`: What a client sends to ask for structure — OpenAI's `response_format` and `tools`, vLLM's `structured_outputs` — becomes one `StructuredOutputsParams` for the engine (chapter 16a); a tool call comes back as `tool_calls`."""

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
