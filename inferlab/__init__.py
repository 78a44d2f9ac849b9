"""A literate, tested reference implementation of the LLM inference stack: model, runtime, quantization, speculation, parallelism, serving and fleet

Modules:

- `inferlab.engine.kv_connector`: One interface for every place KV blocks live or travel besides the engine's own pool: a tier in host memory or on disk, another engine across a process boundary. The engine asks it four things at four fixed points of a step.
- `inferlab.engine.kv_tiers`: Blocks the pool evicts are copied to host memory and to disk, and come back instead of being recomputed: the memory arithmetic, transfer against recompute, a multi-turn chat with a pool too small for it, a restart that starts warm, and what can go wrong with files.
- `inferlab.engine.structured`: A grammar becomes a mask over the vocabulary at every step: JSON that parses, a string from a list, a regex, a tool call that matches its schema. The automaton, its cost per step, what tokens do to it, and where it sits in the engine step.
- `inferlab.frontier.structured_bench`: The step time of a batch whose every request is constrained by a JSON schema, against the same batch free, at batch 1 and at a full batch: the grammar mask's price in the engine step, as `inferlab bench` prints it.
- `inferlab.serve.kv_net`: Shared memory moves a prefill's KV only between processes of one machine. Between machines the bytes cross a network, and three things change: the receiver must find where one payload ends, it must be able to tell a payload cut short or damaged from a good one, and the sender must hold the KV until the receiver asks for it. This chapter builds that transport on plain TCP: a frame with its length up front and a SHA-256 checksum at the end, a KV server in the prefill worker that hands each payload out once to the holder of its token, and the decode side's fetch that turns every failure into a clear error instead of wrong tokens.
- `inferlab.serve.registry`: A disaggregation router needs to know its workers: which exist, where they are, what they serve, whether they are still there. This chapter builds the router's table of workers and the door they come in by — a listener that checks a shared key, a greeting that says who each worker is, heartbeats, and the record of who came and went and why. Workers the router starts itself and workers started by hand on other machines enter the same way.
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
