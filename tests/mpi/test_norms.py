"""LayerNorm over a feature dim split across the world and BatchNorm over rows split across
it (:mod:`plexgt.parallel.norms`) against torch's modules on the whole tensor.

Every rank builds the whole input from a seed and takes its block: uneven blocks (a rank may
hold no true column, padding columns and padding rows on some ranks). float64: the output,
the input's gradient, the parameters' gradients (summed over the ranks, as the callers sum
them), BatchNorm's running statistics after two steps and its evaluation output, and the
ledger against the byte formulas.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from plexgt.distributed.collectives import Comm, CommLedger, all_reduce_
from plexgt.parallel.norms import (
    batch_norm_comm,
    batch_norm_rows,
    layer_norm_cols,
    layer_norm_comm,
)

from .conftest import RANK, WORLD

pytestmark = pytest.mark.timeout(120)
DT = torch.float64
TOL = dict(rtol=1e-9, atol=1e-12)


def _data(rows: int, cols: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=g, dtype=DT) * 3 + 1,
            torch.randn(rows, cols, generator=g, dtype=DT))


def _comm():
    ledger = CommLedger()
    return Comm.from_group(dist.group.WORLD, "world", ledger), ledger


def _summed(t: torch.Tensor, comm: Comm) -> torch.Tensor:
    t = t.clone()
    all_reduce_(t, comm)
    return t


@pytest.mark.parametrize("d", [7, 3 * WORLD + 1])
def test_layer_norm_over_split_features_equals_torch(dist_ctx, d):
    """Rank r holds columns [r·w, (r+1)·w) of the d padded to a multiple of the world (so with
    d = 7 on 8 ranks one rank holds padding only)."""
    n = 11
    x, g = _data(n, d)
    ref = nn.LayerNorm(d, dtype=DT)
    torch.manual_seed(1)  # the same parameters on every rank
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    xr = x.clone().requires_grad_()
    (ref(xr) * g).sum().backward()
    w = -(-d // WORLD)
    c0, c1 = RANK * w, (RANK + 1) * w
    pad = WORLD * w
    xp = torch.zeros(n, pad, dtype=DT)
    xp[:, :d] = x
    gp = torch.zeros(n, pad, dtype=DT)
    gp[:, :d] = g
    wp, bp = torch.zeros(pad, dtype=DT), torch.zeros(pad, dtype=DT)
    wp[:d], bp[:d] = ref.weight.detach(), ref.bias.detach()
    mine = xp[:, c0:c1].clone().requires_grad_()
    weight, bias = wp[c0:c1].clone().requires_grad_(), bp[c0:c1].clone().requires_grad_()
    comm, ledger = _comm()
    mask = torch.arange(c0, c1) < d
    y = layer_norm_cols(mine, weight, bias, mask, d, comm, ref.eps)
    (y * gp[:, c0:c1]).sum().backward()
    dw, db = _summed(weight.grad, Comm.single("none", CommLedger())), bias.grad
    sent = dict(ledger.sent)
    k = mask.nonzero().flatten()  # this rank's true columns: local, and global
    keep = k + c0
    torch.testing.assert_close(y.detach()[:, k], ref(x).detach()[:, keep], **TOL)
    torch.testing.assert_close(y.detach()[:, ~mask], torch.zeros(n, int((~mask).sum()),
                                                                  dtype=DT))
    torch.testing.assert_close(mine.grad[:, k], xr.grad[:, keep], **TOL)
    torch.testing.assert_close(dw[k], ref.weight.grad[keep], **TOL)
    torch.testing.assert_close(db[k], ref.bias.grad[keep], **TOL)
    want = sum(o.sent for o in layer_norm_comm(n, 8, WORLD))
    assert sum(sent.values()) == want


def test_batch_norm_over_split_rows_equals_torch(dist_ctx):
    """Rank r holds rows block r of ceil(N/p), padded (garbage in the padding rows, which
    must not reach the statistics); two training steps then evaluation."""
    n, d = 13, 5
    ref = nn.BatchNorm1d(d, dtype=DT)
    mine = nn.BatchNorm1d(d, dtype=DT)
    torch.manual_seed(1)  # the same parameters on every rank
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
        ref.bias.uniform_(-0.5, 0.5)
    mine.load_state_dict(ref.state_dict())
    rows = -(-n // WORLD)
    r0, r1 = min(n, RANK * rows), min(n, (RANK + 1) * rows)
    comm, ledger = _comm()
    for step in range(2):
        x, g = _data(n, d, seed=step)
        xr = x.clone().requires_grad_()
        yr = ref(xr)  # once: a training forward updates the running statistics
        (yr * g).sum().backward()
        block = torch.full((rows, d), 1e3, dtype=DT)  # padding rows: far from the data
        block[: r1 - r0] = x[r0:r1]
        gb = torch.zeros(rows, d, dtype=DT)
        gb[: r1 - r0] = g[r0:r1]
        xb = block.clone().requires_grad_()
        mine.zero_grad()
        ledger.reset()
        y = batch_norm_rows(xb, mine, torch.arange(rows) < r1 - r0, n, comm)
        (y * gb).sum().backward()
        sent = sum(ledger.sent.values())
        dw, db = _summed(mine.weight.grad, comm), _summed(mine.bias.grad, comm)
        torch.testing.assert_close(y.detach()[: r1 - r0], yr.detach()[r0:r1], **TOL)
        torch.testing.assert_close(xb.grad[: r1 - r0], xr.grad[r0:r1], **TOL)
        assert torch.all(xb.grad[r1 - r0:] == 0)
        torch.testing.assert_close(dw, ref.weight.grad, **TOL)
        torch.testing.assert_close(db, ref.bias.grad, **TOL)
        ref.zero_grad()
        # the per-rank bytes, plus the test's own two gradient sums
        assert sent == sum(o.sent for o in batch_norm_comm(d, 8, WORLD))
    for k in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(mine, k), getattr(ref, k), **TOL)
    mine.eval()
    ref.eval()
    x, _ = _data(n, d, seed=5)
    ledger.reset()
    with torch.no_grad():
        y = batch_norm_rows(x[r0:r1], mine, torch.ones(r1 - r0, dtype=torch.bool), n, comm)
    torch.testing.assert_close(y, ref(x)[r0:r1], **TOL)
    assert sum(ledger.sent.values()) == 0  # evaluation reads the running statistics
