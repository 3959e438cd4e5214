"""The node-sequence sampler: deterministic per (seed, epoch, index) whatever the call order or
cache, hop codes against a brute-force BFS on the original graph, features / labels of the
right nodes, epochs covering the targets once, empty padding sequences; bad input; and a
1-process training loop over it whose loss falls."""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np
import pytest
import torch

from plexgt.config import BatchConfig
from plexgt.data.graph import GraphData, random_split
from plexgt.data.loader import PreparedGraph
from plexgt.data.node_batches import NodeBatches, collate
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.errors import ConfigError
from plexgt.models.hgt import HierarchicalGT
from plexgt.models.sequence import sequence_loss
from plexgt.plan.knobs import load_config
from tests.datagen import prepared_sbm

N, F = 150, 6


def directed_graph() -> GraphData:
    """Directed (no reverse edges added): the codes' direction matters."""
    rng = np.random.default_rng(5)
    src = rng.integers(0, N, 420)
    dst = (src + rng.integers(1, 12, 420)) % N  # local, so 2-hop paths exist
    return GraphData("directed", N, src.astype(np.int64), dst.astype(np.int64),
                     rng.standard_normal((N, F)).astype(np.float32),
                     rng.integers(0, 3, N).astype(np.int64), random_split(N, 1))


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    g = directed_graph()
    path = tmp_path_factory.mktemp("nb") / "g"
    prepare(MemorySource(g), PrepOptions(out=path, tiles=3, progress=False))
    with PreparedGraph(path) as pg:
        yield g, pg


CFG = BatchConfig(targets=6, size=24, sequences=4, context="hop2", global_nodes=1)


def same(a, b) -> None:
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, f.name


def bfs_codes(g: GraphData, orig: np.ndarray) -> np.ndarray:
    """code[i, j]: hop distance from orig[j] to orig[i] along edges inside the set (BFS)."""
    inside = set(orig.tolist())
    out: dict[int, list[int]] = {v: [] for v in inside}
    for s, d in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        if s in inside and d in inside:
            out[s].append(d)
    n = orig.size
    codes = np.full((n, n), 3, dtype=np.int8)
    for j in range(n):
        dist = {int(orig[j]): 0}
        todo = deque([int(orig[j])])
        while todo:
            u = todo.popleft()
            for w in out[u]:
                if w not in dist:
                    dist[w] = dist[u] + 1
                    todo.append(w)
        for i in range(n):
            codes[i, j] = min(3, dist.get(int(orig[i]), 3))
    return codes


def test_codes_features_labels_against_the_original_graph(graph):
    g, pg = graph
    nb = NodeBatches(pg, CFG, seed=3, block_rows=16, cache_blocks=2)
    perm_p = pg.read_perm("P")
    seen = 0
    for split, epoch, index in (("train", 0, 0), ("train", 2, 5), ("valid", 0, 1),
                                ("train", 0, nb.sequences("train") - 1)):
        s = nb.sequence(split, epoch, index)
        orig = perm_p[s.ids.numpy()]
        np.testing.assert_array_equal(s.codes.numpy(), bfs_codes(g, orig))
        np.testing.assert_array_equal(s.features.numpy(), g.features[orig])
        np.testing.assert_array_equal(s.labels.numpy(), g.labels[orig[:s.targets]])
        assert len(set(orig.tolist())) == CFG.size  # N >= N': no node twice
        seen += int((s.codes == 1).sum()) + int((s.codes == 2).sum())
    assert seen > 20  # the check met real 1- and 2-hop pairs


def test_context_comes_from_the_neighbourhood(graph):
    g, pg = graph
    perm_p = pg.read_perm("P")
    inn: dict[int, set[int]] = {v: {v} for v in range(N)}
    for s, d in zip(g.src.tolist(), g.dst.tolist(), strict=True):
        inn[d].add(s)
    filled = drawn = False
    for context, index in (("hop1", 3), ("hop2", 3), ("hop1", 4), ("hop2", 0)):
        nb = NodeBatches(pg, dataclasses.replace(CFG, targets=2, size=8, context=context), 3)
        s = nb.sequence("train", 1, index)
        orig = perm_p[s.ids.numpy()].tolist()
        hop1 = set().union(*(inn[t] for t in orig[:2]))
        near = hop1 if context == "hop1" else set().union(*(inn[v] for v in hop1))
        cand, ctx = near - set(orig[:2]), orig[2:]
        k = min(len(cand), len(ctx))
        assert set(ctx[:k]) <= cand, context  # the neighbourhood first,
        assert not set(ctx[k:]) & cand and (k == len(ctx) or set(ctx[:k]) == cand)  # then fill
        filled |= k < len(ctx)
        drawn |= k > 0
    assert filled and drawn  # both cases met


def test_deterministic_whatever_the_order_and_cache(graph):
    _, pg = graph
    a = NodeBatches(pg, CFG, seed=3, block_rows=7, cache_blocks=1)
    b = NodeBatches(pg, CFG, seed=3, block_rows=64, cache_blocks=50)
    keys = [("train", 0, i) for i in range(a.steps("train") * CFG.sequences)]
    keys += [("train", 1, 2), ("test", 0, 0), ("valid", 5, 1)]
    first = {k: a.sequence(*k) for k in keys}
    for k in reversed(keys):
        same(b.sequence(*k), first[k])
    assert a._adj.reads > b._adj.reads  # the small cache really re-read
    # evaluation ignores the epoch; training epochs differ; seeds differ
    same(a.sequence("valid", 0, 1), a.sequence("valid", 9, 1))
    assert not torch.equal(a.sequence("train", 1, 0).ids, first["train", 0, 0].ids)
    assert not torch.equal(NodeBatches(pg, CFG, seed=4).sequence("train", 0, 0).ids,
                           first["train", 0, 0].ids)


def test_the_default_cache_reads_a_graph_that_fits_its_budget_once(graph):
    # 150 blocks of 1 row, more than the old fixed 64: every sequence gathers its nodes in
    # ascending block order, and an LRU cache smaller than that scan missed on every block
    _, pg = graph
    nb = NodeBatches(pg, CFG, seed=3, block_rows=1)
    for epoch in range(2):
        for i in range(nb.steps("train") * CFG.sequences):
            nb.sequence("train", epoch, i)
    assert nb._adj.reads <= N and nb._feat.reads <= N and nb._labels.reads <= N
    small = NodeBatches(pg, CFG, seed=3, block_rows=1, cache_blocks=64)
    for i in range(small.steps("train") * CFG.sequences):
        small.sequence("train", 0, i)
    assert small._feat.reads > N  # what the fixed count did: re-read within one epoch


def test_an_epoch_covers_the_targets_once_and_pads_with_empty_sequences(graph):
    _, pg = graph
    nb = NodeBatches(pg, CFG, seed=3)
    train = np.flatnonzero(pg.read_mask("train"))
    steps = nb.steps("train")
    assert nb.sequences("train") == -(-train.size // CFG.targets)
    assert steps == -(-nb.sequences("train") // CFG.sequences)
    assert steps * CFG.sequences > nb.sequences("train")  # this split has padding
    got, total = [], 0
    for st in range(steps):
        seqs = nb.step("train", 2, st)
        assert len(seqs) == CFG.sequences
        assert sum(s.targets for s in seqs) == nb.step_targets("train", st)
        total += nb.step_targets("train", st)
        got += [s.ids[:s.targets] for s in seqs]
    assert total == train.size
    np.testing.assert_array_equal(np.sort(torch.cat(got).numpy()), train)
    empty = nb.sequence("train", 2, steps * CFG.sequences - 1)
    assert empty.targets == 0 and empty.labels.numel() == 0 and empty.ids.numel() == CFG.size
    with pytest.raises(IndexError, match="sequence 999"):
        nb.sequence("train", 0, 999)


def test_empty_sequences_weigh_nothing(graph):
    _, pg = graph
    nb = NodeBatches(pg, CFG, seed=3)
    last = nb.steps("train") - 1
    seqs = nb.step("train", 0, last)
    b = collate(seqs)
    model = HierarchicalGT(F, 8, 3, num_layers=2, heads=2, dropout=0.0).double()
    full = sequence_loss(model(b.x.double(), b.ids, b.codes, b.targets, b.seq), b.labels,
                         nb.step_targets("train", last))
    keep = [s for s in seqs if s.targets]
    k = collate(keep)
    part = sequence_loss(model(k.x.double(), k.ids, k.codes, k.targets, k.seq), k.labels,
                         nb.step_targets("train", last))
    assert len(keep) < len(seqs)
    torch.testing.assert_close(full, part)


def test_small_neighbourhoods_fill_with_distinct_nodes(tmp_path):
    """A graph of isolated nodes: context is all fill, distinct while N >= N', repeated when
    the sequence is longer than the graph."""
    g = GraphData("isolated", 30, np.array([0], np.int64), np.array([1], np.int64),
                  np.ones((30, 2), np.float32), np.zeros(30, np.int64), random_split(30, 0))
    prepare(MemorySource(g), PrepOptions(out=tmp_path / "g", progress=False))
    with PreparedGraph(tmp_path / "g") as pg:
        s = NodeBatches(pg, BatchConfig(targets=4, size=20, sequences=1), 0).sequence(
            "train", 0, 0)
        assert len(set(s.ids.tolist())) == 20
        s = NodeBatches(pg, BatchConfig(targets=4, size=40, sequences=1), 0).sequence(
            "train", 0, 0)
        assert len(set(s.ids.tolist())) == 30 and s.ids.numel() == 40
        assert (s.codes.numpy()[s.ids.numpy()[:, None] == s.ids.numpy()[None, :]] == 0).all()


@pytest.mark.parametrize("over, match", [
    ({"batch.targets": 0}, "'batch.targets': 0 must be in"),
    ({"batch.targets": 30, "batch.size": 20}, "'batch.targets': 30 must be in"),
    ({"batch.size": 0}, "'batch.size': 0 must be >= 1"),
    ({"batch.sequences": 0}, "'batch.sequences': 0 must be >= 1"),
    ({"batch.global_nodes": -1}, "'batch.global_nodes'"),
    ({"parallel.cp": "3"}, "'parallel.cp': 3 does not divide batch.size=1024"),
    ({"parallel.dp": "3", "batch.sequences": 4}, "'parallel.dp': 3 does not divide"),
    ({"parallel.dp": "0"}, "'parallel.dp': '0' is not 'auto' or an integer"),
    ({"parallel.stages": "3,7,7,7"}, "sums to 24 layers, not model.layers=6"),
    ({"parallel.stages": "3,0,3"}, "has a stage with no layer"),
    ({"parallel.stages": "3,x"}, "'parallel.stages': '3,x' is not 'auto'"),
    ({"parallel.stages": "3,3", "parallel.pp": "3"}, "is 2 stages, parallel.pp=3"),
    ({"parallel.pp": "7"}, "'parallel.pp': 7 stages for model.layers=6"),
    ({"parallel.micro_batches": 3, "batch.sequences": 4}, "3 does not divide the step's 4"),
    ({"parallel.micro_batches": 2, "batch.sequences": 4, "parallel.dp": "4"},
     "2 does not divide a replica's 1"),
    ({"parallel.strategy": "gp_ag"}, "'parallel.strategy': 'gp_ag' applies to the full-graph"),
    ({"model.super_nodes": 2}, "'model.super_nodes': 2 does not apply"),
    ({"model.norm": "batch"}, "'model.norm': 'batch' does not apply"),
])
def test_bad_input_is_one_line_naming_the_key(over, match):
    flags = {"model.name": "hgt", "model.layers": 6, "model.heads": 4, **over}
    with pytest.raises(ConfigError, match=match) as e:
        load_config(None, flags)
    assert "\n" not in str(e.value)


def test_mesh_keys_are_refused_on_full_graph_models_and_good_ones_pass():
    with pytest.raises(ConfigError, match=r"'parallel.pp': '2' applies to node-sequence "
                                          r"models \(hgt\); gcn trains full-graph"):
        load_config(None, {"parallel.pp": "2"})
    cfg = load_config(None, {"model.name": "hgt", "model.layers": 6, "batch.sequences": 4,
                             "parallel.stages": "1,2,3", "parallel.pp": "3",
                             "parallel.cp": "4", "parallel.dp": "2",
                             "parallel.micro_batches": 2})
    assert cfg.parallel.stages == "1,2,3"


def test_the_sampler_refuses_bad_batches_itself(graph):
    _, pg = graph
    with pytest.raises(ConfigError, match="'batch.targets': 9 must be in \\[1, batch.size=8\\]"):
        NodeBatches(pg, BatchConfig(targets=9, size=8), 0)


def test_a_training_loop_over_sequences_lowers_the_loss(tmp_path):
    """The smoke: 1 process, sampler -> model -> loss over the step's targets -> AdamW."""
    prepared_sbm(tmp_path / "g", 240, 2400, num_classes=3, num_features=8, seed=4,
                 centroid_scale=1.0)
    torch.manual_seed(0)
    with PreparedGraph(tmp_path / "g") as pg:
        cfg = BatchConfig(targets=16, size=40, sequences=2, context="hop1", global_nodes=1)
        nb = NodeBatches(pg, cfg, seed=1)
        model = HierarchicalGT(pg.F, 16, pg.C, num_layers=2, heads=2, dropout=0.1, seed=1)
        opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
        losses, step = [], 0
        for epoch in range(3):
            for st in range(nb.steps("train")):
                b = collate(nb.step("train", epoch, st))
                model.train()
                loss = sequence_loss(model(b.x, b.ids, b.codes, b.targets, b.seq, step),
                                     b.labels, nb.step_targets("train", st))
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
                step += 1
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    assert last < 0.7 * first, losses


def test_in_neighbours_equal_the_prepared_rows_in_any_order(graph):
    """The numpy gather from cached blocks returns each node's A2 row (P columns), rows in the
    order asked, duplicates and empty rows included, across block boundaries."""
    _, pg = graph
    full = pg.read_adjacency("A2", (0, pg.N))
    perm_p, perm_q = pg.read_perm("P"), pg.read_perm("Q")
    qinv = np.empty(pg.N, dtype=np.int64)
    qinv[perm_q] = np.arange(pg.N)
    p2q = qinv[perm_p]
    nb = NodeBatches(pg, CFG, seed=0, block_rows=7, cache_blocks=3)
    rng = np.random.default_rng(0)
    empty = np.flatnonzero(np.diff(full.indptr) == 0)
    for ids in (rng.permutation(pg.N)[:40], np.array([5, 5, 140, 0, 5]),
                np.concatenate([empty[:2], rng.integers(0, pg.N, 9)]), np.zeros(0, np.int64)):
        got = nb.in_neighbours(ids)
        want = full[p2q[ids]]
        assert got.shape == (ids.size, pg.N)
        np.testing.assert_array_equal(np.diff(got.indptr), np.diff(want.indptr))
        for i in range(ids.size):  # same neighbours per row (order within a row free)
            np.testing.assert_array_equal(np.sort(got[i].indices), np.sort(want[i].indices))


def test_the_p_to_q_map_is_read_in_blocks_and_old_directories_still_sample_alike(graph,
                                                                               monkeypatch):
    """prep stores the P -> Q map; the sampler reads it a block at a time and never both
    permutations whole; a directory without it (prepared earlier) composes them as before
    and draws the same sequences."""
    _, pg = graph
    perm_p, perm_q = pg.read_perm("P"), pg.read_perm("Q")
    qinv = np.empty(pg.N, dtype=np.int64)
    qinv[perm_q] = np.arange(pg.N)
    assert pg.has_p2q
    np.testing.assert_array_equal(pg.read_p2q(), qinv[perm_p])
    np.testing.assert_array_equal(pg.read_p2q((7, 19)), qinv[perm_p][7:19])
    real_read_perm = pg.read_perm

    def no_whole_perm(order="P", rows=None):
        assert rows is not None, "a whole permutation read"
        return real_read_perm(order, rows)

    monkeypatch.setattr(pg, "read_perm", no_whole_perm)
    monkeypatch.setattr("plexgt.data.node_batches.P2Q_BLOCK", 16)  # several blocks here
    blocked = NodeBatches(pg, CFG, seed=3, block_rows=16, cache_blocks=2)
    assert blocked._p2q is None
    got = [blocked.sequence("train", 1, i) for i in range(3)]
    assert blocked._p2q_blocks.reads > 1
    monkeypatch.setattr(pg, "read_perm", real_read_perm)
    monkeypatch.setattr(type(pg), "has_p2q", property(lambda self: False))
    old = NodeBatches(pg, CFG, seed=3, block_rows=16, cache_blocks=2)
    assert old._p2q is not None
    for i, s in enumerate(got):
        same(s, old.sequence("train", 1, i))
