import os
os.environ.setdefault("MPLBACKEND", "Agg")
import torch
# Without CUDA, Triton kernels can only run in Triton's interpreter, chosen before triton is first imported
# (transformers and the engine import it): set it here, before any test module is collected.
if not torch.cuda.is_available(): os.environ.setdefault("TRITON_INTERPRET", "1")
