"""GA-CP (plexgt.parallel.ga_cp) against the single process's dense attention.

The world is cut into cp rings of P_cp consecutive ranks for every P_cp dividing it (1 and the
world included; 3 at 3 and 6 ranks); every ring computes the same sequence. Checked, float64:
- the operator: each member's rows of the output equal :func:`attend_reference`'s; the
  gradients of its sequence rows of q, k, v are the single process's, those of the global rows
  and of bias_weight summed over the ring are (each member's share of the global rows' output
  gradient is a different fraction); the ledger's bytes, forward and backward, equal
  :func:`ga_cp_bytes`.
- two pre-norm attention layers (LayerNorm, QKV and output projections, the code bias) on
  a sequence whose global rows are a parameter: the output, the input's gradient and every
  parameter's gradient summed over the ring equal the single process's (the global rows
  replicated through two layers, their gradient shares summed once).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.ops.dense_attention import attend, attend_reference
from plexgt.parallel.ga_cp import GACPAttention, ga_cp_attend, ga_cp_bytes

from .conftest import RANK, WORLD

pytestmark = pytest.mark.timeout(600)
TOL = dict(rtol=1e-9, atol=1e-11)
SIZES = [p for p in range(1, WORLD + 1) if WORLD % p == 0]


@pytest.fixture(scope="module")
def rings(dist_ctx):
    """P_cp -> (this rank's ring group or None for one member, its index in the ring); every
    rank makes every group, in the same order."""
    out = {}
    for p in SIZES:
        mine = None
        for start in range(0, WORLD, p):
            ranks = list(range(start, start + p))
            grp = dist.new_group(ranks) if p > 1 else None
            if RANK in ranks:
                mine = grp
        out[p] = (mine, RANK % p)
    return out


def _comm(rings, p: int) -> Comm:
    grp, c = rings[p]
    return Comm(grp, p, c, "cp", CommLedger())


def _sum_over(x: torch.Tensor, comm: Comm) -> torch.Tensor:
    x = x.clone()
    if comm.size > 1:
        dist.all_reduce(x, group=comm.group)
    return x


def _rows(n: int, c: int, seq: int, n_global: int) -> torch.Tensor:
    """Member c's rows of the model's sequence: its n sequence rows, then the global rows."""
    return torch.cat([torch.arange(c * n, (c + 1) * n), torch.arange(seq, seq + n_global)])


@pytest.mark.parametrize("block", [2, 1000])
@pytest.mark.parametrize("n_global", [0, 2])
@pytest.mark.parametrize("p", SIZES)
def test_ga_cp_attention_equals_single_process(rings, p, n_global, block):
    B, H, D, n = 2, 3, 4, 3  # n rows a member: block 2 does not divide it
    seq = p * n
    S = seq + n_global
    g = torch.Generator().manual_seed(10 + p)
    q, k, v = (torch.randn(B, H, S, D, generator=g, dtype=torch.float64).requires_grad_()
               for _ in range(3))
    codes = torch.randint(0, 4, (B, seq, seq), generator=g).to(torch.int8)
    w = torch.randn(5, H, generator=g, dtype=torch.float64).requires_grad_()
    dout = torch.randn(B, H, S, D, generator=g, dtype=torch.float64)
    y = attend_reference(q, k, v, codes, w)
    (y * dout).sum().backward()

    comm = _comm(rings, p)
    c = comm.rank
    rows = _rows(n, c, seq, n_global)
    ql, kl, vl = (t.detach()[:, :, rows].clone().requires_grad_() for t in (q, k, v))
    wl = w.detach().clone().requires_grad_()
    yl = ga_cp_attend(ql, kl, vl, codes[:, c * n:(c + 1) * n], wl, comm, block=block)
    fwd = comm.ledger.total(kind="sent")
    share = torch.ones(S, dtype=torch.float64)  # the global rows' output gradient, split
    share[seq:] = (c + 1) / (p * (p + 1) / 2)
    (yl * dout[:, :, rows] * share[rows].view(1, 1, -1, 1)).sum().backward()

    torch.testing.assert_close(yl.detach(), y.detach()[:, :, rows], **TOL)
    for name, got, want in (("dq", ql.grad, q.grad), ("dk", kl.grad, k.grad),
                            ("dv", vl.grad, v.grad)):
        torch.testing.assert_close(got[:, :, :n], want[:, :, rows[:n]], **TOL, msg=name)
        torch.testing.assert_close(_sum_over(got[:, :, n:], comm), want[:, :, seq:], **TOL,
                                   msg=name + " global")
    torch.testing.assert_close(_sum_over(wl.grad, comm), w.grad, **TOL, msg="dbias")
    f, b = ga_cp_bytes(B, seq, H, D, p, 8)
    assert (fwd, comm.ledger.total(kind="sent") - fwd) == (f, b)
    assert comm.ledger.total(kind="recv") == f + b
    assert set(comm.ledger.sent) <= {("cp", "send_recv")}


class _Layer(torch.nn.Module):
    """Pre-norm attention block: x + Wo·attend(LN(x)) with a per-layer code bias."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm = torch.nn.LayerNorm(d, dtype=torch.float64)
        self.qkv = torch.nn.Linear(d, 3 * d, dtype=torch.float64)
        self.out = torch.nn.Linear(d, d, dtype=torch.float64)
        self.bias = torch.nn.Embedding(5, heads, dtype=torch.float64)

    def forward(self, x: torch.Tensor, codes: torch.Tensor, attn) -> torch.Tensor:
        B, S, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(B, S, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = attn(q, k, v, codes, self.bias.weight)
        return x + self.out(y.transpose(1, 2).reshape(B, S, d))


def _model(d: int, heads: int, n_global: int) -> torch.nn.Module:
    torch.manual_seed(5)
    m = torch.nn.Module()
    m.blocks = torch.nn.ModuleList(_Layer(d, heads) for _ in range(2))
    m.global_nodes = torch.nn.Parameter(torch.randn(n_global, d, dtype=torch.float64))
    return m


def _run(m, x, codes, attn):
    h = torch.cat([x, m.global_nodes.expand(x.shape[0], -1, -1)], 1)
    for blk in m.blocks:
        h = blk(h, codes, attn)
    return h


@pytest.mark.parametrize("n_global", [0, 2])
@pytest.mark.parametrize("p", SIZES)
def test_two_layers_with_replicated_global_rows_equal_single_process(rings, p, n_global):
    B, H, d, n = 2, 2, 6, 2
    seq = p * n
    g = torch.Generator().manual_seed(20 + p)
    x = torch.randn(B, seq, d, generator=g, dtype=torch.float64).requires_grad_()
    codes = torch.randint(0, 4, (B, seq, seq), generator=g).to(torch.int8)
    wy = torch.randn(B, seq + n_global, d, generator=g, dtype=torch.float64)
    ref = _model(d, H, n_global)
    y = _run(ref, x, codes, lambda *a: attend(*a, block=3))
    (y * wy).sum().backward()  # the global rows' outputs are in the loss too

    comm = _comm(rings, p)
    c = comm.rank
    loc = _model(d, H, n_global)
    xl = x.detach()[:, c * n:(c + 1) * n].clone().requires_grad_()
    yl = _run(loc, xl, codes[:, c * n:(c + 1) * n], GACPAttention(comm, block=3))
    rows = _rows(n, c, seq, n_global)
    mine = wy[:, rows].clone()
    if c:  # a loss term on a global row is counted on one member
        mine[:, n:] = 0
    (yl * mine).sum().backward()
    torch.testing.assert_close(yl.detach(), y.detach()[:, rows], **TOL)
    torch.testing.assert_close(xl.grad, x.grad[:, c * n:(c + 1) * n], **TOL, msg="dx")
    for (name, pl), pr in zip(loc.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(_sum_over(pl.grad, comm), pr.grad, **TOL, msg=name)
    per_layer = sum(ga_cp_bytes(B, seq, H, d // H, p, 8))
    assert comm.ledger.total(kind="sent") == 2 * per_layer
    assert math.isfinite(float(yl.detach().sum()))


@pytest.mark.parametrize("p", [s for s in SIZES if s > 1] or [1])
def test_bfloat16_travels_in_its_dtype(rings, p):
    """bf16 K/V travel as bf16, the dK/dV accumulators as float32: the ledger equals
    ga_cp_bytes(esize=2); the output stays near the float64 single process's."""
    B, H, D, n, n_global = 1, 2, 8, 4, 1
    seq = p * n
    g = torch.Generator().manual_seed(30 + p)
    q, k, v = (torch.randn(B, H, seq + n_global, D, generator=g, dtype=torch.float64)
               for _ in range(3))
    codes = torch.randint(0, 4, (B, seq, seq), generator=g).to(torch.int8)
    w = torch.randn(5, H, generator=g, dtype=torch.float64)
    y = attend_reference(q, k, v, codes, w)
    comm = _comm(rings, p)
    c = comm.rank
    rows = _rows(n, c, seq, n_global)
    ql, kl, vl = (t[:, :, rows].bfloat16().requires_grad_() for t in (q, k, v))
    yl = ga_cp_attend(ql, kl, vl, codes[:, c * n:(c + 1) * n], w.float(), comm, block=3)
    yl.float().sum().backward()
    assert yl.dtype == kl.grad.dtype == torch.bfloat16
    torch.testing.assert_close(yl.double(), y[:, :, rows], rtol=0.05, atol=0.05)
    assert comm.ledger.total(kind="sent") == sum(ga_cp_bytes(B, seq, H, D, p, 2))
