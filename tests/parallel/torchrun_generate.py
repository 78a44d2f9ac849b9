"Run by torchrun in test_launch.py: every rank builds the same LLM and generates; each writes what it got."
import json, os, sys
from inferlab.engine.interface import check_engine
from inferlab.llm import LLM
from inferlab.model.sampling import SamplingParams

if __name__ == "__main__":
    prompts, out = json.load(open(sys.argv[1])), sys.argv[2]
    with LLM("tiny-dense", dtype="float32", tensor_parallel_size=2) as llm:
        engine = type(check_engine(llm.engine)).__name__          # rank 0 leads, every other rank follows
        first = llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0))
        second = llm.generate(prompts[:3] + [list(range(5000, 5003))], SamplingParams(max_tokens=5, temperature=0))
    json.dump(dict(rank=int(os.environ["RANK"]), engine=engine, tokens=[o.token_ids for o in first],
                   second=[[o.token_ids, o.finish_reason] for o in second]), open(f"{out}.{os.environ['RANK']}", "w"))
