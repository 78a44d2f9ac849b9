"The model layer (chapters 0x): configs, tokenizer, decoder, checkpoint loading, sampling, reference generate, training."
# Written by hand (like nbdev's own __init__.py): the layer's front door, `from inferlab.model import load_model`.
from .config import ModelConfig, load_config
from .model import CausalLM, load_model, save_model
from .tokenizer import Tokenizer, load_tokenizer
