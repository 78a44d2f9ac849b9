"Every bad input of the model layer raises an error that names the file, tensor, field or id at fault."
import json, shutil
import pytest, torch
from safetensors.torch import load_file, save_file
from inferlab.model.config import ModelConfig, load_config
from inferlab.model.model import CausalLM, load_model, save_model
from inferlab.model.tokenizer import load_tokenizer
from inferlab.model.generate import generate_one
from inferlab.model.sampling import SamplingParams

@pytest.fixture()
def ckpt(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2)
    save_model(CausalLM(cfg), tmp_path / "m")
    return tmp_path / "m"

def _rewrite(path, edit):
    sd = load_file(str(path / "model.safetensors")); edit(sd); save_file(sd, str(path / "model.safetensors"))

def test_loads_when_good(ckpt):
    assert load_model(ckpt).config.num_hidden_layers == 2

def test_missing_safetensors_file(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=rf"{ckpt}: no \*.safetensors checkpoint"): load_model(ckpt)

def test_missing_shard_listed_in_index(ckpt):
    shutil.move(ckpt / "model.safetensors", ckpt / "model-00001-of-00002.safetensors")
    names = list(load_file(str(ckpt / "model-00001-of-00002.safetensors")))
    wmap = {n: "model-00001-of-00002.safetensors" for n in names}
    wmap[names[0]] = "model-00002-of-00002.safetensors"
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wmap}))
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors: listed in model.safetensors.index.json but missing"):
        load_model(ckpt)

def test_sharded_checkpoint_loads(ckpt):
    sd = load_file(str(ckpt / "model.safetensors")); (ckpt / "model.safetensors").unlink()
    names = sorted(sd); half = len(names) // 2
    shards = {"a.safetensors": names[:half], "b.safetensors": names[half:]}
    for f, ns in shards.items(): save_file({n: sd[n] for n in ns}, str(ckpt / f))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: f for f, ns in shards.items() for n in ns}}))
    m = load_model(ckpt)
    assert torch.equal(m.model.embed_tokens.weight, sd["model.embed_tokens.weight"])

def test_corrupt_safetensors(ckpt):
    (ckpt / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!" + b"\x00" * 10)
    with pytest.raises(ValueError, match="model.safetensors: not a valid safetensors file"): load_model(ckpt)

def test_truncated_safetensors(ckpt):
    data = (ckpt / "model.safetensors").read_bytes()
    (ckpt / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.safetensors: not a valid safetensors file"): load_model(ckpt)

def test_missing_tensor(ckpt):
    _rewrite(ckpt, lambda sd: sd.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(ValueError, match="tensor 'model.layers.1.mlp.down_proj.weight' is missing"): load_model(ckpt)

def test_shape_disagrees_with_config(ckpt):
    _rewrite(ckpt, lambda sd: sd.__setitem__("model.layers.0.self_attn.v_proj.weight", torch.zeros(32, 32)))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.self_attn.v_proj.weight' has shape \[32, 32\] but config.json implies \[16, 32\]"):
        load_model(ckpt)

def test_unexpected_tensor(ckpt):
    _rewrite(ckpt, lambda sd: sd.__setitem__("model.layers.7.extra.weight", torch.zeros(2)))
    with pytest.raises(ValueError, match="unexpected tensor 'model.layers.7.extra.weight'"): load_model(ckpt)

def test_unsupported_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text()); cfg["architectures"] = ["GPT2LMHeadModel"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: architecture 'GPT2LMHeadModel' is not supported"): load_model(ckpt)

def test_config_field_invalid(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text()); cfg["num_key_value_heads"] = 3
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"config.json: num_key_value_heads: 3 must divide num_attention_heads=4"): load_config(ckpt)

def test_config_missing_and_invalid_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config.json: not valid JSON"): load_model(ckpt)
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"): load_model(ckpt)

def test_pickle_is_never_loaded(ckpt, monkeypatch):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")
    import pickle
    monkeypatch.setattr(pickle, "load", lambda *a, **k: pytest.fail("pickle.load was called"))
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load was called"))
    with pytest.raises(FileNotFoundError, match="pytorch_model.bin: pickled checkpoints are never loaded"): load_model(ckpt)

def test_token_id_outside_vocab(ckpt):
    m = load_model(ckpt)
    with pytest.raises(ValueError, match=r"input_ids: token id 64 is outside the vocabulary \[0, 64\)"): m(torch.tensor([[1, 2, 64]]))
    with pytest.raises(ValueError, match=r"token id -1 is outside"): m(torch.tensor([[-1]]))
    with pytest.raises(ValueError, match=r"prompt: token id 99 is outside the vocabulary"):
        generate_one(m, None, [1, 99], SamplingParams(max_tokens=2))

def test_unknown_model_path():
    with pytest.raises(FileNotFoundError, match="'/no/such/dir' is neither a shipped model nor a directory"): load_model("/no/such/dir")

def test_missing_tokenizer(ckpt):
    with pytest.raises(FileNotFoundError, match="tokenizer.json: no tokenizer.json"): load_tokenizer(ckpt)

def test_bad_dtype_and_device(ckpt):
    with pytest.raises(ValueError, match="dtype: 'int4'"): load_model(ckpt, dtype="int4")
    with pytest.raises(ValueError, match="device: 'tpu'"): load_model(ckpt, device="tpu")

def _edit_config(ckpt, **fields):
    cfg = json.loads((ckpt / "config.json").read_text()); cfg.update(fields)
    (ckpt / "config.json").write_text(json.dumps(cfg))

@pytest.mark.parametrize("fields, field", [(dict(tie_word_embeddings="false"), "tie_word_embeddings"),
                                           (dict(rms_norm_eps="1e-5"), "rms_norm_eps"), (dict(head_dim="8"), "head_dim"),
                                           (dict(num_key_value_heads="2"), "num_key_value_heads"),
                                           (dict(rope_theta=None), "rope_theta"),
                                           (dict(architectures="LlamaForCausalLM"), "architectures")])
def test_config_field_types_are_checked(ckpt, fields, field):
    _edit_config(ckpt, **fields)
    with pytest.raises(ValueError, match=rf"config.json: field '{field}' must be"): load_model(ckpt)

@pytest.mark.parametrize("text, msg", [("[1, 2]", "expected a JSON object, got list"), ("null", "got NoneType"),
                                       (b"\xff\xfe{}", "not UTF-8")])
def test_config_not_an_object_or_not_utf8(ckpt, text, msg):
    f = ckpt / "config.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=msg): load_model(ckpt)

@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd"])
def test_index_may_not_point_outside_the_model_directory(ckpt, target):
    names = list(load_file(str(ckpt / "model.safetensors")))
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: target for n in names}}))
    with pytest.raises(ValueError, match="outside the model directory"): load_model(ckpt)

def test_fifo_checkpoint_is_refused_not_opened(ckpt):
    import os
    (ckpt / "model.safetensors").unlink(); os.mkfifo(ckpt / "model.safetensors")   # opening it would block forever
    with pytest.raises(ValueError, match="model.safetensors: not a regular file"): load_model(ckpt)

@pytest.mark.parametrize("bad", [torch.zeros(16, 32, dtype=torch.int8), torch.zeros(16, 32, dtype=torch.bool),
                                 torch.zeros(16, 32, dtype=torch.int64)])
def test_integer_or_bool_tensor_in_a_float_parameter(ckpt, bad):
    _rewrite(ckpt, lambda sd: sd.__setitem__("model.layers.0.self_attn.v_proj.weight", bad))
    with pytest.raises(ValueError, match=r"tensor 'model.layers.0.self_attn.v_proj.weight' is (int8|bool|int64)"):
        load_model(ckpt)

def test_non_finite_weights_are_named_at_load(ckpt):
    def poison(sd): sd["model.layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
    _rewrite(ckpt, poison)
    with pytest.raises(ValueError, match=r"tensor 'model.layers.1.mlp.down_proj.weight' holds non-finite values"):
        load_model(ckpt)
