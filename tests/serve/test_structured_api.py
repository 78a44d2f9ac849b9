"""Structured outputs through the official `openai` client against a real `inferlab serve`: 20 JSON schemas x 5 seeds
at T = 1, forced tool calls, regex and choice — every reply parses and validates; malformed requests are 400s naming
the field."""
import json, re
from concurrent.futures import ThreadPoolExecutor
import httpx, jsonschema, openai, pytest

MODEL = "tiny-dense"
MSGS = [{"role": "user", "content": "Describe the item as JSON."}]

SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "alpha": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["color", "alpha"]},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {"x": {"type": "number", "minimum": -10, "maximum": 10}, "y": {"type": "number", "minimum": -10, "maximum": 10}}, "required": ["x", "y"]}}, "required": ["point"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"id": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1000}, "label": {"type": "string", "pattern": "^[a-z]{1,6}$"}}, "required": ["id", "label"]},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}, "roles": {"type": "array", "items": {"enum": ["admin", "dev", "ops"]}, "minItems": 1, "maxItems": 3}}, "required": ["name", "roles"]}}, "required": ["user"]},
    {"type": "object", "properties": {"temperature": {"type": "number", "minimum": -40.5, "maximum": 60.25}}, "required": ["temperature"]},
    {"type": "object", "properties": {"status": {"const": "done"}, "count": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["status", "count"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "string", "maxLength": 5}]}}, "required": ["value"]},
    {"type": "object", "properties": {"matrix": {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}}, "required": ["matrix"]},
    {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 12}, "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}, "required": ["name", "email"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 6}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}}, "required": ["sku", "qty"]}, "minItems": 1, "maxItems": 3}}, "required": ["items"]},
    {"type": "object", "properties": {"lang": {"enum": ["python", "rust", "go"]}, "version": {"type": "string", "pattern": "^[0-9]\\.[0-9]{1,2}$"}}, "required": ["lang", "version"]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 100, "maximum": 999}, "b": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5}, "c": {"type": "boolean"}}, "required": ["a", "b", "c"], "additionalProperties": False},
    {"type": "object", "properties": {"nullable": {"type": ["string", "null"], "maxLength": 6}, "flag": {"type": "boolean"}}, "required": ["nullable", "flag"]},
    {"type": "object", "properties": {"tree": {"type": "object", "properties": {"left": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["v"]}, "right": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["v"]}}, "required": ["left", "right"]}}, "required": ["tree"]},
    {"type": "array", "items": {"enum": ["up", "down", "left", "right"]}, "minItems": 2, "maxItems": 5},
    {"type": "object", "properties": {"func": {"type": "string", "pattern": "^def [a-z_]{1,10}\\(\\):$"}, "lines": {"type": "integer", "minimum": 1, "maximum": 50}}, "required": ["func", "lines"]},
]

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
              "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}}},
         {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
              "a": {"type": "integer", "minimum": -100, "maximum": 100}, "b": {"type": "integer", "minimum": -100,
              "maximum": 100}}, "required": ["a", "b"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {
              "query": {"type": "string", "maxLength": 30}, "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
              "required": ["query"]}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", max_retries=0, timeout=120)

def test_json_schemas_validate(client):
    "20 schemas x 5 seeds (n=5: choice i samples with seed + i) at T = 1: 100 replies, every one valid."
    def one(i):
        fmt = {"type": "json_schema", "json_schema": {"name": f"schema_{i}", "schema": SCHEMAS[i]}}
        r = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=10 * i, n=5,
                                           max_tokens=300, response_format=fmt)
        for c in r.choices:
            assert c.finish_reason == "stop", (i, c.message.content)
            jsonschema.validate(json.loads(c.message.content), SCHEMAS[i])
        return len(r.choices)
    with ThreadPoolExecutor(8) as ex: assert sum(ex.map(one, range(len(SCHEMAS)))) == 100

def test_json_object_and_stream(client):
    r = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=3, max_tokens=200,
                                       response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMAS[7]}}
    chunks = list(client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=4, max_tokens=300,
                                                 response_format=fmt, stream=True))
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), SCHEMAS[7])

@pytest.mark.parametrize("choice", ["required", "named"])
def test_tool_calls_validate(client, choice):
    for seed in range(5):
        tc = "required" if choice == "required" else {"type": "function", "function": {"name": TOOLS[seed % 3]["function"]["name"]}}
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Call a tool."}],
                                           tools=TOOLS, tool_choice=tc, temperature=1.0, seed=seed, max_tokens=300)
        c = r.choices[0]
        assert c.finish_reason == ("tool_calls" if choice == "required" else "stop") and c.message.tool_calls
        for call in c.message.tool_calls:
            assert call.type == "function" and call.id.startswith("call_")
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
            if choice == "named": assert call.function.name == tc["function"]["name"]

def test_tool_calls_stream(client):
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Add."}], tools=TOOLS,
                                                 tool_choice="required", temperature=1.0, seed=9, max_tokens=300, stream=True))
    calls = [t for c in chunks if c.choices for t in (c.choices[0].delta.tool_calls or [])]
    assert calls and [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    for t in calls: jsonschema.validate(json.loads(t.function.arguments), PARAMS[t.function.name])

def test_regex_and_choice(client):
    for pattern in [r"[a-z]{3,8}@[a-z]{2,6}\.(com|org)", r"\d{4}-\d{2}-\d{2}", r"(def|class) [a-z_]{1,12}:"]:
        r = client.completions.create(model=MODEL, prompt="x = ", temperature=1.0, seed=1, n=5, max_tokens=60,
                                      extra_body={"structured_outputs": {"regex": pattern}})
        for c in r.choices: assert re.fullmatch(pattern, c.text), (pattern, c.text)
    options = ["positive", "negative", "neutral", "not sure"]
    r = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=1.0, seed=2, n=5, max_tokens=20,
                                       extra_body={"structured_outputs": {"choice": options}})
    assert all(c.message.content in options for c in r.choices)

@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"extra": {"structured_outputs": {"regex": "(unclosed"}}}, "structured_outputs.regex"),
    ({"extra": {"structured_outputs": {"grammar": "root ::= nothing"}}}, "structured_outputs.grammar"),
    ({"tools": TOOLS}, "tool_choice"), ({"tools": TOOLS, "tool_choice": "auto"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"extra": {"guided_json": {"type": "object"}}}, "guided_json"),
])
def test_bad_structure_is_400(server, body, param):
    b = {"model": MODEL, "messages": MSGS, "max_tokens": 8, **{k: v for k, v in body.items() if k != "extra"},
         **body.get("extra", {})}
    r = httpx.post(server[0] + "/v1/chat/completions", json=b, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
