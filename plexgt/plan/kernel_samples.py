"""The kernel calls ``plexgt profile`` times (:func:`kernel_samples`), each with its sizes.

Moved out of :mod:`plexgt.plan.measure` (which runs and fits them) so that what is timed, at
which sizes, reads in one place: SpMM and SDDMM over patterns from tiny (the per-call cost) to
one or two nonzeros a row (the per-row cost) and dense ones (the per-nonzero cost), the
attention kernel and the ring's recomputing one, GEMMs, streaming passes, the dense block and
whole one-rank gt and GCN steps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch

from plexgt.distributed.collectives import Comm, CommLedger
from plexgt.distributed.grid import Grid3D
from plexgt.distributed.layout3d import layer_layouts
from plexgt.models.gt import GTBlock
from plexgt.models.layers import ffn, residual_norm, sparse_features
from plexgt.ops.attention import (
    sampled_addmm_available,
    sddmm,
    sparse_attention,
    torch_kernels_reason,
)
from plexgt.ops.csr import CSRGraph
from plexgt.ops.gcn import spmm_forward
from plexgt.parallel.attention.registry import default_registry
from plexgt.parallel.attention.ring import Ring, column_blocks, ring_attention
from plexgt.parallel.gt_dist import DistGraphTransformer
from plexgt.parallel.plexus3d import Plexus3DGCN, gcn_block_values
from plexgt.parallel.rows1d import RowParallel, build_dist_graph
from plexgt.plan.profile import GT_STEP_SHAPE


def random_graph(n: int, deg: int, seed: int, device: torch.device, cols: int | None = None
                  ) -> Any:
    """[n, cols] (default n x n) pattern, ``deg`` uniform random columns a row (duplicates
    merged)."""

    cols = n if cols is None else cols
    g = torch.Generator().manual_seed(seed)
    dst = torch.arange(n).repeat_interleave(deg)
    src = torch.randint(0, cols, (n * deg,), generator=g)
    graph = CSRGraph.from_coo(dst, src, n, cols).to(device)
    graph.transpose()
    _ = graph.row
    return graph


def dense_block(rows: int, d: int, device: torch.device) -> Callable[[], Any]:
    """Forward + backward of a GT block without its attention kernel (rows [rows, d])."""

    blk = GTBlock(d, 4, 2, 0.0).to(device)
    x = torch.randn(rows, d, device=device, requires_grad=True)

    def run() -> None:
        a = blk.attn
        y = a.q(x) + a.k(x) + a.v(x) + a.o(x)
        h = residual_norm(x, y, blk.norm1)
        out = residual_norm(h, ffn(h, blk.ffn1, blk.ffn2), blk.norm2)
        out.sum().backward()

    return run


GT_STEPS = ((4000, 20, 64, 4), (16000, 10, 128, 8))
"""[N, degree, hidden, heads] of the whole gt training steps the profile times (2 layers, 128
input features, 8 classes): what calibrates the kernel sums of :mod:`plexgt.plan.agp`."""


def gt_step(n: int, deg: int, hidden: int, heads: int, device: torch.device
            ) -> tuple[int, Callable[[], Any]]:
    """(E, one training step of the row-parallel gt on one rank: forward, loss, backward,
    AdamW) on a uniform random graph of n nodes, ``deg`` neighbours a node: the code
    ``plexgt train`` runs (the registry's baseline strategy, whose collectives are the
    identity on one rank), not the single-process model, whose layout shortcuts make it
    faster."""

    shape = GT_STEP_SHAPE
    pattern = random_graph(n, deg, 200 + n, torch.device("cpu")).to_scipy()
    comm = Comm.single("rows", CommLedger())
    graph = build_dist_graph(n, pattern, comm, default_registry().baseline(), heads)
    model = DistGraphTransformer(shape["features"], hidden, shape["classes"], shape["layers"],
                                 heads, dropout=0.0, ffn_mult=shape["ffn_mult"])
    step = RowParallel(model, graph.to(device), comm).to(device)
    opt = torch.optim.AdamW(step.parameters(), lr=1e-3)
    x = torch.randn(n, shape["features"], device=device)
    y = torch.randint(0, shape["classes"], (n,), device=device)

    def run() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(step(x), y).backward()
        opt.step()

    return pattern.nnz, run


GCN_STEPS = ((8000, 16, 256, 64, 0.0), (16000, 16, 4096, 64, 0.005),
             (32768, 16, 512, 128, 0.0), (32768, 16, 8192, 64, 0.004))
"""[N, degree, F, hidden, input density (0: dense)] of the whole one-rank GCN steps (2 layers,
8 classes) that calibrate the 3D model's SpMM + GEMM sums
(:func:`plexgt.plan.plexus_cost.gcn_step_calibration`): dense inputs, and wide sparse ones
whose layer 0 is an SpMM both ways."""


def gcn_step(n: int, deg: int, features: int, hidden: int, density: float,
             device: torch.device) -> tuple[list[float], Callable[[], Any]]:
    """(the sample's sizes [N, E, F, C, hidden, layers, density], one training step of the
    3D GCN on a one-rank grid: forward, loss, backward, AdamW) on a uniform random graph with
    self loops and a dense or CSR input: the code ``plexgt train`` runs, its collectives the
    identity."""

    classes, layers = GT_STEP_SHAPE["classes"], GT_STEP_SHAPE["layers"]
    rng = np.random.default_rng(300 + n)
    a = (random_graph(n, deg, 300 + n, torch.device("cpu")).to_scipy()
         + sp.identity(n, format="csr")).tocsr()  # A + I, as prep stores it
    a.data[:] = 1.0
    d = np.diff(a.indptr)
    adj = gcn_block_values(a, d, d)
    if density:
        xs = sp.random(n, features, density=density, format="csr", random_state=rng,
                       dtype=np.float32)
        x: Any = sparse_features(xs, device)
        nnz_density = xs.nnz / (n * features)
    else:
        x, nnz_density = torch.randn(n, features, device=device), 0.0
    dims = [features, hidden, classes]
    lays = layer_layouts(Grid3D(1, 1, 1), 0, n, dims,
                         first_order="gemm_first" if density else None)
    ledger = CommLedger()
    comms = {name: Comm.single(name, ledger) for name in ("x", "y", "z", "plane")}
    model = Plexus3DGCN(lays, comms, [adj] * layers).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    y = torch.randint(0, classes, (n,), device=device)

    def run() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x)[:n], y).backward()
        opt.step()

    return [n, adj.nnz, features, classes, hidden, layers, nnz_density], run


def kernel_mix(device: torch.device) -> Callable[[], Any]:
    """A fixed GEMM + attention workload (for the contention measurement)."""

    graph = random_graph(3000, 16, 7, device)
    a = torch.randn(3000, 64, device=device)
    w = torch.randn(64, 64, device=device)
    q = torch.randn(3000, 4, 16, device=device, requires_grad=True)

    def run() -> None:
        for _ in range(4):
            a @ w
        sparse_attention(graph, q, q, q).sum().backward()

    return run


class Sample(NamedTuple):
    """One call :func:`profile_kernels` times; its row is ``[*sizes, seconds, *tail]``."""

    kind: str
    sizes: list[float]
    fn: Callable[[], Any]
    tail: tuple[float, ...] = ()
    """Sizes recorded after the seconds (attention's rows and cols, where later profile
    versions appended them)."""


def _attention_samples(g: Any, rows: int, cols: int, device: torch.device,
                       recompute: bool = False) -> list[Sample]:
    """Forward + backward of the attention kernel on ``g`` for three (h, d'): rows
    [E, h, d', seconds, rows, cols]; with ``recompute``, the same of the ring's block kernel
    on the whole pattern as one block (kind 'recompute'): what the ring strategies and blocked
    rows pay over the fused kernel (scores rebuilt in backward from the saved log-sum-exp,
    the block's rows gathered and merged)."""

    out: list[Sample] = []
    ring = None
    # a ROCm GPU runs the ring's blocks on the fused kernel only (no sampled_addmm there)
    if recompute and (sampled_addmm_available(device) or not torch_kernels_reason(32)):
        whole = ((0, cols),)
        ring = Ring(Comm.single("ring", CommLedger()), column_blocks(g, 1, cols, whole), whole)
    for h, dh in ((2, 16), (4, 16), (4, 32)):
        q = torch.randn(rows, h, dh, device=device, requires_grad=True)
        k = torch.randn(cols, h, dh, device=device, requires_grad=True)

        def att(g: Any = g, q: torch.Tensor = q, k: torch.Tensor = k) -> None:
            sparse_attention(g, q, k, k).sum().backward()

        out.append(Sample("attention", [g.num_edges, h, dh], att, (rows, cols)))
        if ring is not None:
            def rc(q: torch.Tensor = q, k: torch.Tensor = k, ring: Ring = ring) -> None:
                ring_attention(q, k, k, ring).sum().backward()

            out.append(Sample("recompute", [g.num_edges, h, dh], rc, (rows, cols)))
    return out


def gathered_sddmm(graph: CSRGraph, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """[Nr, h, d] x [Nc, h, d] -> [h, E] as :func:`~plexgt.ops.attention.sddmm`, by gathering
    each edge's rows: what the profile times as the SDDMM where torch has none (ROCm GPUs;
    [E, h, d] temporaries, fine at the profile's sizes)."""
    return (a.index_select(0, graph.row) * b.index_select(0, graph.indices)).sum(-1).t()


def spmm_samples(g: CSRGraph, d: int, device: torch.device) -> list[Sample]:
    """The GCN's SpMM (:func:`~plexgt.ops.gcn.spmm_forward`: a weighted [rows, cols] CSR
    times [cols, d]) on pattern ``g``: [nnz, d, seconds, rows]."""
    w = g.with_values(torch.rand(g.num_edges, device=device))
    x = torch.randn(g.num_cols, d, device=device)
    return [Sample("spmm", [g.num_edges, d], lambda w=w, x=x: spmm_forward(w, x),
                   (g.num_rows,))]


def kernel_samples(device: torch.device, quick: bool) -> list[Sample]:
    """Every kernel call :func:`profile_kernels` times, with its sizes."""

    graphs = [(2000, 8), (4000, 32)] if quick else [(2000, 8), (8000, 16), (6000, 64),
                                                     (3000, 256), (32768, 16)]
    # [rows, cols] patterns with 2x and 4x more columns than rows: GP-AG's local rows against
    # the gathered K, V, which separates the kernel's per-row from its per-column costs
    # and sparse ones (2 edges a row) where those per-node costs are most of the time, in
    # both directions, so the fit can tell them from the per-edge ones
    rect = [(1000, 4000, 32)] if quick else [(2000, 8000, 16), (4096, 8192, 32),
                                             (8192, 32768, 16), (8192, 65536, 2),
                                             (65536, 8192, 2), (32768, 32768, 2)]
    out: list[Sample] = []
    for i, (n, deg) in enumerate(graphs):
        g = random_graph(n, deg, i, device)
        e = g.num_edges
        for d in (16, 64):
            x = torch.randn(1, n, d, device=device)
            out += spmm_samples(g, d, device)
            xn = x.transpose(0, 1)  # sddmm takes node-major [N, h, d]
            sd = sddmm if sampled_addmm_available(device) else gathered_sddmm
            out.append(Sample("sddmm", [e, d], lambda g=g, x=xn, f=sd: f(g, x, x)))
        out += _attention_samples(g, n, n, device, recompute=True)
    for i, (rows, cols, deg) in enumerate(rect):
        g = random_graph(rows, deg, 100 + i, device, cols)
        out += _attention_samples(g, rows, cols, device)
    # SpMM alone on a tiny pattern (its per-call cost) and on ones of 1-2 nonzeros a row,
    # square and [rows, 4 rows] (the per-output-row cost: a thin rank's block of a sparse
    # graph): with the denser patterns above, the three terms of the fit tell apart
    for i, (rows, cols, deg) in enumerate([(256, 256, 4)] if quick else
                                          [(256, 256, 4), (32768, 32768, 2),
                                           (65536, 16384, 1), (8192, 32768, 2)]):
        g = random_graph(rows, deg, 150 + i, device, cols)
        for d in (16, 64):
            out += spmm_samples(g, d, device)
    shapes = [(4096, 64, 64), (16384, 64, 64)] if quick else [
        (4096, 64, 64), (16384, 64, 64), (16384, 128, 128), (32768, 64, 256), (8192, 512, 64)]
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device)
        b = torch.randn(k, n, device=device)
        out.append(Sample("gemm", [m, k, n], lambda a=a, b=b: a @ b))
    for n in ((1 << 18, 1 << 21) if quick else (1 << 18, 1 << 20, 1 << 22, 1 << 23)):
        # outputs written into buffers kept across calls: a fresh allocation of tens of MB is
        # an mmap whose page faults cost 1x-5x the pass itself, depending on whether the kernel
        # found huge pages that time (measured bimodal); what is priced is the streaming
        a = torch.randn(n, device=device)
        b = torch.randn(n, device=device)
        c = torch.empty(n, device=device)
        out.append(Sample("elementwise", [n],
                    lambda a=a, b=b, c=c: torch.mul(a, b, out=c).add_(a)))
        x = torch.randn(n // 64, 4, 16, device=device)
        y = torch.empty(4, n // 64, 16, device=device)
        out.append(Sample("copy", [n], lambda x=x, y=y: y.copy_(x.transpose(0, 1))))
    for d in (32, 64, 128):
        for rows in ((256, 2048) if quick else (256, 2048, 8192, 32768)):
            out.append(Sample("dense_block", [rows, d], dense_block(rows, d, device)))
    sh = GT_STEP_SHAPE
    for n, deg, hidden, heads in ((2000, 10, 32, 4), (4000, 8, 64, 4)) if quick else GT_STEPS:
        e, step = gt_step(n, deg, hidden, heads, device)
        out.append(Sample("gt_step", [n, e, sh["features"], sh["classes"], hidden, heads,
                                sh["layers"]], step))
    for n, deg, f, hidden, density in GCN_STEPS[:2] if quick else GCN_STEPS:
        sizes, step = gcn_step(n, deg, f, hidden, density, device)
        out.append(Sample("gcn_step", sizes, step))
    return out
