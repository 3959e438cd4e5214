"""Hubs and super nodes on the fused kernel: long rows and columns cut into segments.

A row of the pattern (or, in the column backward, a column of it) longer than
``SPLIT_STEPS·BLOCK_E`` edges is walked by several programs into partial buffers that merge
kernels fold in slot order (plexgt.ops.attention_schedule). Checked here: the schedule covers
every edge once, the split path runs (segments in use for the hub row and the super columns),
y and every gradient (q, k, v, W_b, the residual) equal torch's kernels, and two runs give the
same bits (no atomics). Under Triton's interpreter here, compiled on a GPU.
"""

import pytest
import torch

from plexgt.ops import attention_triton
from plexgt.ops.attention_schedule import schedule
from plexgt.ops.csr import CSRGraph
from tests.unit.test_ops_attention_fused_bias import _inputs, _reference, _run

pytestmark = [
    pytest.mark.skipif(attention_triton.triton is None, reason="triton is not installed"),
    pytest.mark.timeout(180),
]
NR, NC, SUPER = 60, 90, (87, 88, 89)
NAMES = ("y", "dq", "dk", "dv", "dW_b", "d_residual")


def hub_and_super_graph(hub_degree: int = 85) -> CSRGraph:
    """Rows 0 and 7 empty, row 3 a hub of ``hub_degree`` columns (>= 50x the mean degree of
    the other rows), the rest sparse; every row but the empty ones names the three super
    columns (in-degree 58, the longest columns)."""
    g = torch.Generator().manual_seed(5)
    dst = torch.randint(0, NR, (30,), generator=g)
    src = torch.randint(0, NC - len(SUPER), (30,), generator=g)
    keep = (dst != 0) & (dst != 7) & (dst != 3)
    rows = torch.tensor([r for r in range(NR) if r not in (0, 7)])
    dst = torch.cat([dst[keep], torch.full((hub_degree,), 3), rows.repeat(len(SUPER))])
    src = torch.cat([src[keep], torch.randperm(NC - len(SUPER), generator=g)[:hub_degree],
                     torch.tensor(SUPER).repeat_interleave(len(rows))])
    graph = CSRGraph.from_coo(dst, src, NR, NC)
    deg = graph.degrees()
    plain = (deg - len(SUPER)).clamp(min=0).double()
    assert plain[3] >= 50 * plain[torch.arange(NR) != 3].mean()
    return graph


def _split_in_use(graph: CSRGraph, h: int, d: int) -> tuple[int, int]:
    """(segments of long rows, of long columns) the launches use at h heads of d'."""
    out = []
    for g in (graph, graph.transpose()):
        be = attention_triton.blocks(g.num_rows, g.num_edges, d, h).block_e
        s = schedule(g, attention_triton.SPLIT_STEPS * be)
        out.append(int((s.seg_row >= 0).sum()))
    return out[0], out[1]


def test_schedule_covers_every_edge_once():
    graph = hub_and_super_graph()
    for g in (graph, graph.transpose()):
        for split in (1, 4, 16, 1000):
            s = schedule(g, split)
            cover = torch.zeros(g.num_edges, dtype=torch.int64)
            for row, a, b in [(s.light_row, s.light_start, s.light_end),
                              (s.seg_row, s.seg_start, s.seg_end)]:
                for r, e0, e1 in zip(row.tolist(), a.tolist(), b.tolist()):
                    if r >= 0:
                        assert g.indptr[r] <= e0 < e1 <= g.indptr[r + 1] or e0 == e1
                        cover[e0:e1] += 1
            assert torch.equal(cover, torch.ones_like(cover)), (split, g.shape)
            deg = g.degrees()[s.light_row[s.light_row >= 0].long()]
            assert torch.all(deg[:-1] >= deg[1:])  # light rows by falling degree
            assert schedule(g, split) is s  # cached


@pytest.mark.parametrize(("steps", "h", "d"), [(1, 2, 8), (2, 1, 32), (4, 3, 16)])
def test_hub_and_super_columns_float64_and_bitwise_repeatable(steps, h, d, monkeypatch):
    monkeypatch.setattr(attention_triton, "SPLIT_STEPS", steps)
    graph = hub_and_super_graph()
    long_rows, long_cols = _split_in_use(graph, h, d)
    assert long_rows >= 2 and (long_cols >= 6 or steps == 4), (long_rows, long_cols)
    args = _inputs(graph, h, d, torch.float64, seed=h * d)
    res = torch.randn(NR, h * d, dtype=torch.float64)
    y_ref, g_ref = _reference(graph, *args, 0.4, res)
    first = _run(graph, *args, 0.4, "fused", res)
    second = _run(graph, *args, 0.4, "fused", res)
    for a, b, what in zip((first[0], *first[1]), (y_ref.reshape(first[0].shape), *g_ref),
                          NAMES):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=what)
    for a, b, what in zip((first[0], *first[1]), (second[0], *second[1]), NAMES):
        assert torch.equal(a, b), what


def test_hub_and_super_columns_float32_within_rounding(monkeypatch):
    """float32 against float64 arithmetic on the same rounded inputs: each result within
    1e-5 of its largest entry (the merges add one rescale per segment)."""
    monkeypatch.setattr(attention_triton, "SPLIT_STEPS", 1)
    graph = hub_and_super_graph()
    args = _inputs(graph, 2, 16, torch.float32, seed=3)
    y_ref, g_ref = _reference(graph, *args, 0.25)
    y, grads = _run(graph, *args, 0.25, "fused")
    for a, b, what in zip((y, *grads), (y_ref, *g_ref), NAMES):
        assert a.dtype == torch.float32
        err = (a.double() - b).abs().max() / b.abs().max()
        assert err < 1e-5, (what, float(err))


def test_pipeline_stages_change_no_bits(monkeypatch):
    """The edge loops' num_stages reaches every launch (a value the kernel cannot take would
    fail to compile) and pipelining changes no arithmetic: the same bits at 1 and 4 stages."""
    monkeypatch.setattr(attention_triton, "SPLIT_STEPS", 2)
    graph = hub_and_super_graph()
    args = _inputs(graph, 2, 8, torch.float32, seed=9)
    runs = []
    for stages in (1, 4):
        monkeypatch.setattr(attention_triton, "EDGE_STAGES", stages)
        y, grads = _run(graph, *args, 0.3, "fused")
        runs.append((y, *grads))
    for a, b, what in zip(*runs, NAMES):
        assert torch.equal(a, b), what


@pytest.mark.parametrize(("h", "d", "group_elems"), [(5, 16, 32), (3, 256, None)])
def test_head_groups_with_masked_heads(h, d, group_elems, monkeypatch):
    """A program owns a group of HG heads (a power of two), fewer than h when h·d' passes
    GROUP_ELEMS: 5 heads of 16 in groups of 2 under a cap of 32, and 3 heads of 256 in
    groups of 2 under the real cap; the last group holds one real head and one masked.
    Hub rows and super columns split (SPLIT_STEPS = 1), with bias and residual: float64
    against torch's kernels."""
    if group_elems is not None:
        monkeypatch.setattr(attention_triton, "GROUP_ELEMS", group_elems)
    monkeypatch.setattr(attention_triton, "SPLIT_STEPS", 1)
    graph = hub_and_super_graph()
    hg = attention_triton.blocks(graph.num_rows, graph.num_edges, d, h).heads
    assert hg == 2 and h % hg
    assert min(_split_in_use(graph, h, d)) >= 2
    args = _inputs(graph, h, d, torch.float64, seed=h + d)
    res = torch.randn(NR, h * d, dtype=torch.float64)
    y_ref, g_ref = _reference(graph, *args, 0.3, res)
    y, grads = _run(graph, *args, 0.3, "fused", res)
    for a, b, what in zip((y, *grads), (y_ref.reshape(y.shape), *g_ref), NAMES):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11, msg=what)


def test_partial_buffers_are_allocated_once_per_schedule(monkeypatch):
    """The split launches' partial buffer lives with the schedule: a second forward and
    backward on the same pattern reuse the row and column schedules' buffers (same storage,
    nothing new allocated) and give the same bits. Before, every call allocated W·h·d' of
    partials per launch (~40 MB at E = 20M, h·d' = 128)."""
    monkeypatch.setattr(attention_triton, "SPLIT_STEPS", 1)
    graph = hub_and_super_graph()
    h, d = 2, 8
    args = _inputs(graph, h, d, torch.float64, seed=4)
    first = _run(graph, *args, 0.3, "fused")
    scheds = [schedule(g, attention_triton.SPLIT_STEPS
                       * attention_triton.blocks(g.num_rows, g.num_edges, d, h).block_e)
              for g in (graph, graph.transpose())]
    bufs = [s.work[torch.float64] for s in scheds]
    w = [int(s.seg_row.numel()) for s in scheds]
    assert all(n > 0 for n in w)
    assert [b.numel() for b in bufs] == [n * h * max(d + 2, 2 * d) for n in w]
    second = _run(graph, *args, 0.3, "fused")
    assert [list(s.work) for s in scheds] == [[torch.float64]] * 2
    assert [s.work[torch.float64].data_ptr() for s in scheds] == [b.data_ptr() for b in bufs]
    for a, b, what in zip((first[0], *first[1]), (second[0], *second[1]), NAMES):
        assert torch.equal(a, b), what
