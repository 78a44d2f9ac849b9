"The shipped model family: loads in inferlab and in `transformers` with the same logits, and has really learned."
import json, math
import pytest, torch
import transformers
from inferlab.model.config import shipped_model_path, SHIPPED_MODELS, num_params, load_config
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer

TEXT = "import os\n\n\ndef walk(top, topdown=True):\n    \"\"\"Directory tree generator.\"\"\"\n    for root, dirs, files in os.walk(top):\n"

@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_same_logits_as_transformers(name):
    path = shipped_model_path(name)
    ids = torch.tensor([load_tokenizer(path).encode(TEXT)])
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad(): diff = (hf(ids).logits - load_model(path)(ids)).abs().max().item()
    print(f"{name}: max |logit difference| = {diff:.2e}")
    assert diff < 1e-4

@pytest.mark.parametrize("name", SHIPPED_MODELS)
def test_learned_far_below_unigram(name):
    log = json.loads((shipped_model_path(name) / "training_log.json").read_text())
    assert log["params"] == num_params(load_config(shipped_model_path(name)))
    assert log["valid_perplexity"] < log["unigram_perplexity"] / 10

def test_transformers_tokenizer_agrees():
    path = shipped_model_path("tiny-dense")
    hf_tok = transformers.AutoTokenizer.from_pretrained(path)
    assert hf_tok(TEXT)["input_ids"] == load_tokenizer(path).encode(TEXT)
