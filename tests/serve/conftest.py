"The shared server fixture of the server tests."
import pytest
from serve_helpers import serve_process

@pytest.fixture(scope="module")
def server():
    with serve_process("tiny-dense", "--max-num-seqs", "32", "--num-kv-blocks", "1024", "--max-waiting", "256") as (base, proc):   # `serve MODEL`, as vLLM
        yield base, proc
