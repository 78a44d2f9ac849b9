"""Chapter 14a: oneDNN's GEMM for a prefill's rows, on the K-major weight as it lies: the product to float32
rounding on ragged shapes and thread counts, `torch.matmul` wherever oneDNN does not apply, and the engine's
linear layers taking it for steps of more than SMALL_STEP_TOKENS rows only."""
import pytest
import torch
from inferlab.engine import cpu_gemm, model_runner
from inferlab.engine.cpu_gemm import many_rows_matmul, onednn_linear_available, ONEDNN_MIN_ROWS
from inferlab.engine.model_runner import KMajorLinear, SMALL_STEP_TOKENS

@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("M,K,N", [(9, 300, 67), (1, 5, 3), (130, 17, 1), (600, 256, 704)])
def test_product_to_float32_rounding(M, K, N, threads):
    g = torch.Generator().manual_seed(M + K + N)
    x, w_t = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    saved = torch.get_num_threads(); torch.set_num_threads(threads)
    try: y = many_rows_matmul(x, w_t)
    finally: torch.set_num_threads(saved)
    exact = x.double() @ w_t.double()
    assert y.shape == (M, N) and y.dtype == torch.float32
    assert (y.double() - exact).abs().max() < 1e-5 * K ** 0.5 * exact.abs().max()

def test_oneDNN_is_available_on_this_x86_build():
    import platform
    if platform.machine() != "x86_64": pytest.skip("oneDNN's x86 kernels")
    assert onednn_linear_available()
    x, w_t = torch.randn(ONEDNN_MIN_ROWS, 32), torch.randn(32, 16)               # the fewest rows oneDNN takes
    assert torch.allclose(many_rows_matmul(x, w_t), x @ w_t, atol=1e-5)

def test_falls_back_to_matmul_bit_for_bit(monkeypatch):
    g = torch.Generator().manual_seed(1)
    x, w_t = torch.randn(3, 40, 64, generator=g), torch.randn(64, 48, generator=g)
    assert torch.equal(many_rows_matmul(x.bfloat16(), w_t.bfloat16()), x.bfloat16() @ w_t.bfloat16())
    assert torch.equal(many_rows_matmul(x[0, 0], w_t), x[0, 0] @ w_t)           # a vector: matmul's
    assert torch.equal(many_rows_matmul(x[0, :1], w_t), x[0, :1] @ w_t)         # one row: MKL's faster route
    padded = torch.randn(56, 80, generator=g)[:, :64]                             # [N, K] rows with gaps
    assert torch.equal(many_rows_matmul(x, padded.t()), x @ padded.t())          # oneDNN's reference loop: avoided
    monkeypatch.setattr(cpu_gemm, "onednn_linear_available", lambda: False)
    assert torch.equal(many_rows_matmul(x, w_t), x @ w_t)

def test_autograd_takes_matmul():
    x, w_t = torch.randn(12, 8, requires_grad=True), torch.randn(8, 5)
    many_rows_matmul(x, w_t).pow(2).sum().backward()
    x2 = x.detach().clone().requires_grad_(); (x2 @ w_t).pow(2).sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)

def test_engine_layers_send_only_many_rows_here(monkeypatch):
    lin = torch.nn.Linear(64, 96, bias=True)
    km, calls = KMajorLinear(lin.weight, lin.bias), []
    monkeypatch.setattr(model_runner, "many_rows_matmul", lambda x, w_t: calls.append(x.shape) or x @ w_t)
    with torch.no_grad():
        for rows in (1, SMALL_STEP_TOKENS, SMALL_STEP_TOKENS + 1, 300):
            x = torch.randn(1, rows, 64)
            assert torch.allclose(km(x), lin(x), atol=1e-5), rows
    assert [s[1] for s in calls] == [SMALL_STEP_TOKENS + 1, 300]
