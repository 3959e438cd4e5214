"""``deterministic``: bit-exact or a one-line error, never a warning and a drifting GPU run.

torch's deterministic mode swaps CUDA's atomic index_add_ / scatter_add_ / accumulating
index_put_ for sorted variants by itself; what has no deterministic variant must stop the run
(it only warned with ``warn_only=True``), and plexgt's own kernels take no atomics on a GPU.
No GPU here: an op without a deterministic variant on the CPU (``put_``) stands for the CUDA
ones, and the ring's kernels run on the device audit's declared device (tests/device_audit.py),
where they take their GPU branches, with the ops they run recorded.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.errors import ConfigError
from plexgt.ops.csr import CSRGraph
from plexgt.parallel.attention.ring import Ring, column_blocks, ring_attention
from plexgt.plan.knobs import load_config
from plexgt.training import loop
from plexgt.training.numerics import apply_numerics
from tests.device_audit import DECLARED, DeviceAudit

ATOMIC_ON_CUDA = ("aten.index_add", "aten.scatter_add", "aten.scatter_reduce",
                  "aten.index_reduce", "aten.put_", "(accumulate)")
"""Ops CUDA runs with atomics (nondeterministic sums) unless torch's mode swaps them."""


@pytest.fixture
def deterministic(monkeypatch):
    for k in ("CUBLAS_WORKSPACE_CONFIG", "MKL_CBWR"):
        monkeypatch.delenv(k, raising=False)
    apply_numerics(load_config(None, {"deterministic": True}))  # undone by tests/conftest.py


def test_deterministic_mode_raises_instead_of_warning(deterministic):
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_an_op_without_a_deterministic_variant_stops_the_step_in_one_line(deterministic,
                                                                         monkeypatch):
    """Before, the op only warned and the step went on (not bit-exact); now the step
    ends in a ConfigError naming the key, the op and the device."""

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            x = x.clone()
            x.put_(torch.tensor([0, 2]), torch.tensor([1.0, 2.0]))  # none on any device
            return x * self.w

    model = Model()
    task = SimpleNamespace(model=model, inputs=torch.zeros(4), amp=None,
                           loss=lambda out: out.sum(), ledger=CommLedger())
    opt = torch.optim.AdamW(model.parameters())
    cfg = load_config(None, {"deterministic": True})
    monkeypatch.setattr(loop.dist, "barrier", lambda: None)
    with pytest.raises(ConfigError, match=r"config key 'deterministic': put_ has no "
                                          r"deterministic implementation on cpu.*without "
                                          r"--deterministic"):
        loop.step(cfg, task, opt, 0)


def test_other_runtime_errors_of_a_step_are_left_alone():
    e = RuntimeError("CUDA out of memory")
    assert loop.nondeterministic_error(e, torch.device("cuda")) is e


def _ring_case(n: int = 24, heads: int = 2, dh: int = 8):
    g = torch.Generator().manual_seed(3)
    dense = torch.rand(n, n, generator=g) < 0.3
    graph = CSRGraph.from_coo(*dense.nonzero().t(), n, n)
    whole = ((0, n),)
    x = [torch.randn(n, heads, dh, generator=g) for _ in range(3)]
    bias = torch.randn(heads, graph.num_edges, generator=g)
    return graph, whole, x, bias


def test_the_ring_kernels_take_no_atomics_on_a_gpu(deterministic):
    """The ring's block backward summed each block's dQ into the rank's rows with index_add_
    (CUDA: atomics); on a GPU it now gathers, adds and copies. Run on the declared device
    with an edge bias (torch's kernels, the GPU's path), no atomic op is reached, and the
    gradients are those of the CPU run."""
    graph, whole, x, bias = _ring_case()

    def run(device):
        g = graph.to(device)
        ring = Ring(Comm.single("ring", CommLedger()), column_blocks(g, 1, graph.num_cols,
                                                                     whole), whole)
        q, k, v = (t.detach().to(device).requires_grad_() for t in x)
        b = bias.detach().to(device).requires_grad_()
        ring_attention(q, k, v, ring, None, b).square().sum().backward()
        return [t.grad for t in (q, k, v, b)]

    want = run(torch.device("cpu"))
    with DeviceAudit() as audit:
        got = run(DECLARED)
    atomic = [op for op in audit.ops if any(a in op for a in ATOMIC_ON_CUDA)]
    assert not atomic, atomic
    assert "aten.index_copy_.default" in audit.ops
    for a, b in zip(got, want):
        torch.testing.assert_close(a.elem if hasattr(a, "elem") else a, b)
