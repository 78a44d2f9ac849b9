"Properties of the reference generate and the streaming detokenizer on the shipped model."
import subprocess, sys, shutil
import pytest, torch
from hypothesis import given, settings, strategies as st, HealthCheck
from inferlab.model.model import load_model
from inferlab.model.tokenizer import load_tokenizer, detokenize_incremental
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams

MODEL, TOK = load_model(), load_tokenizer()
PROMPT = "def parse_args(argv):\n    "
FULL = generate_one(MODEL, TOK, PROMPT, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))

@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_stop_string_cuts_before_its_first_occurrence(data):
    text = FULL.text
    i = data.draw(st.integers(0, len(text) - 1)); n = data.draw(st.integers(1, 6))
    stop = text[i:i + n]
    out = generate_one(MODEL, TOK, PROMPT, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True, stop=[stop]))
    assert out.finish_reason == "stop" and out.text == text[:text.index(stop)]
    assert out.token_ids == FULL.token_ids[:len(out.token_ids)]

@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_streamed_pieces_join_to_the_decoded_text(text):
    ids = TOK.encode(text)
    pieces, po, ro = [], 0, 0
    for n in range(1, len(ids) + 1):
        piece, po, ro = detokenize_incremental(TOK, ids[:n], po, ro)
        assert "\ufffd" not in piece or "\ufffd" in text
        pieces.append(piece)
    tail = TOK.decode(ids[po:])[len(TOK.decode(ids[po:ro])):]
    assert "".join(pieces) + tail == TOK.decode(ids) == text

def test_finish_reasons_and_lengths():
    assert FULL.finish_reason == "length" and len(FULL.token_ids) == 48
    out = generate_one(MODEL, TOK, PROMPT, SamplingParams(temperature=0, max_tokens=48, stop_token_ids=[FULL.token_ids[5]], ignore_eos=True))
    assert out.finish_reason == "stop" and out.token_ids == FULL.token_ids[:6]
    near_end = [1] * (MODEL.config.max_position_embeddings - 3)
    out = generate_one(MODEL, None, near_end, SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 3      # the context, not max_tokens, ended it

def test_cli_generate_subprocess():
    exe = shutil.which("inferlab", path=str(__import__("pathlib").Path(sys.executable).parent))
    assert exe, "the inferlab console script is not installed"
    r = subprocess.run([exe, "generate", "import os\n", "--max-tokens", "12", "--temperature", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("import os\n") and "tokens/s" in r.stderr
    r = subprocess.run([exe, "generate", "x", "--top-p", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "top_p: must be in (0, 1]" in r.stderr

def test_penalties_change_the_greedy_output_and_match_a_hand_loop():
    "Chapter 05a's processors inside the reference generate, against a loop without cache written from transformers' "
    "repetition penalty and OpenAI's formula."
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    first = FULL.token_ids[0]
    sp = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5,
                        presence_penalty=0.25, logit_bias={first: -5.0})
    out = generate_one(MODEL, TOK, PROMPT, sp)
    assert out.token_ids != FULL.token_ids[:24] and out.finish_reason == "length"
    seq = TOK.encode(PROMPT); n = len(seq)
    with torch.no_grad():
        for _ in range(24):
            z = MODEL(torch.tensor([seq]))[0, -1:].clone()
            z[0, first] += -5.0
            z = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([seq]), z)
            c = torch.bincount(torch.tensor(seq[n:], dtype=torch.long), minlength=z.shape[-1]).float()
            seq.append(int((z - c * 0.5 - (c > 0).float() * 0.25).argmax()))
    assert out.token_ids == seq[n:]

def test_min_tokens_bad_words_and_structure_in_generate():
    p = 'if __name__ == "__main__":\n    main()\n'
    eos = set(MODEL.config.eos_token_ids)
    short = generate_one(MODEL, TOK, p, SamplingParams(temperature=0, max_tokens=16))
    assert short.finish_reason == "stop" and len(short.token_ids) == 1          # the model ends at once
    held = generate_one(MODEL, TOK, p, SamplingParams(temperature=0, max_tokens=16, min_tokens=6))
    assert len(held.token_ids) >= 6 and not eos & set(held.token_ids[:5])
    banned = set(TOK.encode("None") + TOK.encode(" None"))
    base = generate_one(MODEL, TOK, "def f(x):\n    if x is", SamplingParams(temperature=0, max_tokens=12))
    assert banned & set(base.token_ids)
    out = generate_one(MODEL, TOK, "def f(x):\n    if x is", SamplingParams(temperature=0, max_tokens=12, bad_words=["None"]))
    assert not banned & set(out.token_ids)
    with pytest.raises(ValueError, match=r"structured_outputs: .*the engine applies structure \(chapter 16a\)"):
        generate_one(MODEL, TOK, PROMPT, SamplingParams(structured_outputs={"regex": "[a-z]+"}))
    with pytest.raises(ValueError, match="bad_words: need a tokenizer"):
        generate_one(MODEL, None, [5, 6], SamplingParams(bad_words=["None"]))
