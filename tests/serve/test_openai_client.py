"The server through the official `openai` client (sync and async, streaming and not), against a real `inferlab serve`."
import asyncio, time
import httpx, openai, pytest
from serve_helpers import metric

MODEL = "tiny-dense"
PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):",
           "# parse a config file\n", "x = [i * i for i in"]

@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=60)

def test_models(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL] and client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError): client.models.retrieve("gpt-4")

@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_stream_equals_whole(client, prompt):
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text and len(text) > 0
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens + whole.usage.completion_tokens == whole.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason

def test_chat_stream_equals_whole(client):
    msgs = [{"role": "system", "content": "write python"}, {"role": "user", "content": "a function that reverses a list"}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=30, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert whole.choices[0].message.role == "assistant" and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert whole.usage.prompt_tokens > 10                      # the template's text counts

def test_stop_strings(client):
    full = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=48, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]
    assert stop.strip(), full
    for stream in (False, True):
        r = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=48, temperature=0, stop=[stop], stream=stream)
        text = "".join(c.choices[0].text for c in r) if stream else r.choices[0].text
        assert text == full[:full.index(stop)] and stop not in text

def test_seeded_reproducibility(client):
    kw = dict(model=MODEL, prompt=PROMPTS[0], max_tokens=24, temperature=1.0, top_p=0.95, extra_body={"ignore_eos": True})
    a = client.completions.create(seed=1234, n=3, **kw)
    b = client.completions.create(seed=1234, n=3, **kw)
    texts = [c.text for c in sorted(a.choices, key=lambda c: c.index)]
    assert texts == [c.text for c in sorted(b.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3                                  # choice i samples with seed + i
    s = "".join(c.choices[0].text for c in client.completions.create(seed=1234, stream=True, **kw))
    assert s == texts[0]                                         # streamed or not, alone or with others
    assert client.completions.create(seed=99, **kw).choices[0].text != texts[0]

def test_logprobs_and_echo(client):
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.token_logprobs) == 6
    assert all(len(t) == 3 and max(t.values()) == pytest.approx(l) for t, l in zip(lp.top_logprobs, lp.token_logprobs))
    e = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, echo=True)
    assert e.choices[0].text == PROMPTS[0] + r.choices[0].text
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    assert len(c.choices[0].logprobs.content) == c.usage.completion_tokens and len(c.choices[0].logprobs.content[0].top_logprobs) == 2

def test_token_id_and_batched_prompts(client):
    r = client.completions.create(model=MODEL, prompt=[PROMPTS[0], PROMPTS[2]], max_tokens=8, temperature=0, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3] and r.usage.completion_tokens == 32
    ids = httpx.post(client.base_url.join("completions").__str__(), json={"prompt": [5, 6, 7, 8], "max_tokens": 3,
                                                                          "ignore_eos": True}).json()
    assert ids["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}

async def _stream(ac, i):
    n = 8 + i % 25
    s = await ac.completions.create(model=MODEL, prompt=PROMPTS[i % len(PROMPTS)] + f" # {i}", max_tokens=n,
                                    temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True},
                                    extra_body={"ignore_eos": True})
    text, use = "", None
    async for c in s:
        if c.choices: text += c.choices[0].text
        if c.usage: use = c.usage
    return n, use.completion_tokens, text

def test_64_concurrent_streams_no_leak(server):
    base = server[0]
    running0 = metric(base, "inferlab:num_requests_running")
    async def go():
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120) as ac:
            return await asyncio.gather(*(_stream(ac, i) for i in range(64)))
    res = asyncio.run(go())
    assert all(n == got for n, got, _ in res), [(n, got) for n, got, _ in res if n != got]
    t0 = time.monotonic()
    while metric(base, "inferlab:kv_cache_usage_perc") != 0.0 and time.monotonic() - t0 < 10: time.sleep(0.05)
    assert metric(base, "inferlab:kv_cache_usage_perc") == 0.0 and metric(base, "inferlab:num_requests_running") == running0
    assert metric(base, "inferlab:num_requests_waiting") == 0

def test_async_client_whole_responses(server):
    async def go():
        async with openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0) as ac:
            rs = await asyncio.gather(*(ac.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0) for p in PROMPTS))
            return [r.choices[0].text for r in rs]
    sync = openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0)
    assert asyncio.run(go()) == [sync.completions.create(model=MODEL, prompt=p, max_tokens=12, temperature=0).choices[0].text
                                 for p in PROMPTS]

def test_disconnect_aborts(server):
    base = server[0]
    before = metric(base, "inferlab:request_success_total", finished_reason="abort")
    with httpx.stream("POST", base + "/v1/completions", json={"prompt": "class Tree:", "max_tokens": 1000, "temperature": 0,
                                                              "ignore_eos": True, "stream": True}, timeout=30) as r:
        got = 0
        for line in r.iter_lines():
            got += line.startswith("data:")
            if got == 3: break                                   # hang up mid-stream
    t0 = time.monotonic()
    while metric(base, "inferlab:request_success_total", finished_reason="abort") == before and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert metric(base, "inferlab:request_success_total", finished_reason="abort") == before + 1
    while metric(base, "inferlab:kv_cache_usage_perc") != 0.0 and time.monotonic() - t0 < 10: time.sleep(0.05)
    assert metric(base, "inferlab:kv_cache_usage_perc") == 0.0

def test_disconnect_aborts_whole_response(server):
    base = server[0]
    before = metric(base, "inferlab:request_success_total", finished_reason="abort")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(base + "/v1/completions", json={"prompt": "def long():", "max_tokens": 1500, "ignore_eos": True}, timeout=0.5)
    t0 = time.monotonic()
    while metric(base, "inferlab:request_success_total", finished_reason="abort") == before and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert metric(base, "inferlab:request_success_total", finished_reason="abort") == before + 1

# -- scoring: echo + logprobs (OpenAI's legacy form, what lm-evaluation-harness's local-completions sends), max_tokens 0,
#    vLLM's prompt_logprobs; the numbers against the model's own forward pass in this process (float32, as served)

@pytest.fixture(scope="module")
def scorer():
    import torch
    from inferlab.model.config import shipped_model_path
    from inferlab.model.model import load_model
    from inferlab.model.tokenizer import load_tokenizer
    path = shipped_model_path(MODEL)
    model, tok = load_model(path, dtype=torch.float32), load_tokenizer(path)
    def logprobs(ids):
        "log p(ids[i] | ids[:i]) for i >= 1, and whether each is the argmax, from one forward pass."
        with torch.no_grad(): lp = torch.log_softmax(model(torch.tensor([ids]))[0].float(), -1)
        return [lp[i - 1, t].item() for i, t in enumerate(ids) if i], [int(lp[i - 1].argmax()) == t for i, t in enumerate(ids) if i]
    return tok, logprobs

def test_lm_eval_loglikelihood_request(server, scorer):
    "The exact body lm-eval's local-completions sends for loglikelihood requests, parsed as it parses the reply."
    tok, logprobs = scorer
    ctx, conts = tok.encode("def add(a, b):\n"), [tok.encode("    return a + b\n"), tok.encode(" pass")]
    body = {"model": MODEL, "prompt": [ctx + c for c in conts], "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    r = httpx.post(server[0] + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    worst = 0.0
    for choice, cont in zip(sorted(r.json()["choices"], key=lambda c: c["index"]), conts):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ctx) + len(cont) + 1 == len(lp["text_offset"])    # prompt, then the 1 generated
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        got, tops = lp["token_logprobs"][len(ctx):-1], lp["top_logprobs"][len(ctx):-1]   # lm-eval's slice
        want, argmax = logprobs(ctx + cont)
        worst = max(worst, max(abs(a - b) for a, b in zip(got, want[len(ctx) - 1:])))
        is_greedy = all(t == max(top.values()) for t, top in zip(got, tops))            # lm-eval's test, with ==
        assert is_greedy == all(argmax[len(ctx) - 1:]) and all(len(t) == 1 for t in tops)
        assert lp["text_offset"] == sorted(lp["text_offset"]) and choice["text"].startswith(tok.decode(ctx + cont))
    print(f"\nmax |served - forward pass| {worst:.1e}")
    assert worst < 1e-4

def test_echo_max_tokens_zero(client, server, scorer):
    tok, logprobs = scorer
    text = PROMPTS[2]
    ids = tok.encode(text)
    zero = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=2, temperature=0)
    one = client.completions.create(model=MODEL, prompt=text, max_tokens=1, echo=True, logprobs=2, temperature=0)
    c, lp = zero.choices[0], zero.choices[0].logprobs
    assert c.text == text and c.finish_reason == "length" and zero.usage.completion_tokens == 0
    assert lp.tokens == one.choices[0].logprobs.tokens[:-1] and lp.token_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(one.choices[0].logprobs.token_logprobs[1:-1], abs=1e-6)
    assert len(lp.tokens) == len(ids) and max(abs(a - b) for a, b in zip(lp.token_logprobs[1:], logprobs(ids)[0])) < 1e-4
    plain = client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True)           # no logprobs: the text
    assert plain.choices[0].text == text and plain.choices[0].logprobs is None
    chunks = list(client.completions.create(model=MODEL, prompt=text, max_tokens=0, echo=True, logprobs=2, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text and chunks[-1].usage.completion_tokens == 0
    streamed = [ch.choices[0].logprobs for ch in chunks if ch.choices and ch.choices[0].logprobs]
    assert len(streamed) == 1 and streamed[0].token_logprobs[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-6)
    r = httpx.post(server[0] + "/v1/completions", json={"prompt": text, "max_tokens": 0}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"               # 0 only with echo

def test_echo_logprobs_stream_equals_whole(client):
    kw = dict(model=MODEL, prompt=PROMPTS[1], max_tokens=12, temperature=0, echo=True, logprobs=3, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw)
    chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text and whole.choices[0].text.startswith(PROMPTS[1])
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and len(streamed) == whole.usage.prompt_tokens + 12
    assert streamed[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:], abs=1e-6)

def test_prompt_logprobs_vllm_field(client, server, scorer):
    tok, logprobs = scorer
    text = PROMPTS[0]
    ids = tok.encode(text)
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=2, temperature=0, n=2, extra_body={"prompt_logprobs": 3})
    want, argmax = logprobs(ids)
    for c in r.choices:
        pl = c.model_extra["prompt_logprobs"]
        assert len(pl) == len(ids) and pl[0] is None
        for e, t, w, best in zip(pl[1:], ids[1:], want, argmax):
            mine = e[str(t)]
            assert abs(mine["logprob"] - w) < 1e-4 and mine["decoded_token"] == tok.decode([t]) and (mine["rank"] == 1) == best
            assert sorted(v["rank"] for v in e.values())[:3] == [1, 2, 3]                      # the top 3 ...
            assert len(e) == (3 if mine["rank"] <= 3 else 4)                                   # ... and the token
    chat = httpx.post(server[0] + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2, "prompt_logprobs": 0}, timeout=30).json()
    assert chat["prompt_logprobs"][0] is None and len(chat["prompt_logprobs"]) == chat["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in chat["prompt_logprobs"][1:])                              # k = 0: the token alone

def test_penalties_and_biases_accepted(client):
    "Fields the engine's SamplingParams carries are passed, not refused (their effect is the engine's, chapter 05a)."
    r = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=6, temperature=0, presence_penalty=0.5,
                                  frequency_penalty=-0.5, logit_bias={"50": -100, "7": 2.5},
                                  extra_body={"repetition_penalty": 1.1, "min_tokens": 2, "bad_words": ["xyz"]})
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens >= 2
