"""Writers of small graphs in every layout the readers accept, for tests and examples.

Each writer emits the layout exactly as its publisher does (gnn-benchmark npz, the OGB csv.gz
and npz raw layouts, SNAP edge lists, MatrixMarket), so a round trip writer -> reader -> prep
exercises the same code paths as the real downloads.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from plexgt.data.graph import GraphData
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import MemorySource
from plexgt.data.synthetic import sbm


def small_graph(n: int = 37, e: int = 150, f: int = 5, c: int = 3, seed: int = 0) -> GraphData:
    """A random directed graph with duplicates and self loops, features, labels and a split."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n, e, dtype=np.int64)
    dst = rng.integers(0, n, e, dtype=np.int64)
    src[:3], dst[:3] = src[3:6], dst[3:6]  # duplicates
    src[6], dst[6] = 4, 4  # a self loop
    feats = rng.standard_normal((n, f)).astype(np.float32)
    labels = rng.integers(0, c, n, dtype=np.int64)
    perm = rng.permutation(n)
    a, b = int(0.5 * n), int(0.75 * n)
    splits = {"train": np.sort(perm[:a]), "valid": np.sort(perm[a:b]), "test": np.sort(perm[b:])}
    return GraphData("small", n, src, dst, feats, labels, splits)


def prepared_sbm(out: Path, num_nodes: int, num_edges: int, *, tiles: int = 1,
                 symmetrize: bool = True, **sbm_keys) -> Path:
    """``out``: an SBM graph (``plexgt.data.synthetic.sbm`` with ``sbm_keys``) prepared on
    ``tiles`` tiles, progress bars off: the small trainable graph most tests start from."""
    prepare(MemorySource(sbm(num_nodes, num_edges, **sbm_keys)),
            PrepOptions(out=out, tiles=tiles, symmetrize=symmetrize, progress=False))
    return out


def one_sided(n: int = 60, e: int = 240, seed: int = 0) -> GraphData:
    """An undirected graph listed once: distinct pairs s < d, no reverse among them."""
    rng = np.random.default_rng(seed)
    a, b = rng.integers(0, n, (2, 4 * e))
    keep = a < b
    key = np.unique(a[keep] * n + b[keep])[:e]
    rng.shuffle(key)
    src, dst = key // n, key % n
    return GraphData("one-sided", n, src.astype(np.int64), dst.astype(np.int64),
                     rng.standard_normal((n, 3)).astype(np.float32),
                     rng.integers(0, 2, n).astype(np.int64))


def with_reverse(g: GraphData, share: float) -> GraphData:
    """``g`` plus the reverse of its first ``share`` of edges."""
    k = int(share * g.num_edges)
    return GraphData(g.name, g.num_nodes, np.r_[g.src, g.dst[:k]], np.r_[g.dst, g.src[:k]],
                     g.features, g.labels)


def write_gnn_benchmark(path: Path, g: GraphData) -> Path:
    """gnn-benchmark npz: CSR adjacency (row = source), CSR features, labels."""
    adj = sp.csr_matrix((np.ones(g.num_edges, dtype=np.float32), (g.src, g.dst)),
                        shape=(g.num_nodes, g.num_nodes))
    attr = sp.csr_matrix(g.features)
    np.savez(path, adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr,
             adj_shape=np.array(adj.shape), attr_data=attr.data, attr_indices=attr.indices,
             attr_indptr=attr.indptr, attr_shape=np.array(attr.shape), labels=g.labels)
    return path


def _gz_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


def write_ogb_splits(root: Path, splits: dict[str, np.ndarray]) -> None:
    """OGB's ``split/random/{train,valid,test}.csv.gz`` under ``root``: one node id a line."""
    for k, ids in splits.items():
        _gz_lines(root / "split" / "random" / f"{k}.csv.gz", [str(int(i)) for i in ids])


def write_ogb_csv(root: Path, g: GraphData) -> Path:
    """OGB csv.gz raw layout (ogbn-arxiv / ogbn-products)."""
    raw = root / "raw"
    _gz_lines(raw / "edge.csv.gz", [f"{s},{d}" for s, d in zip(g.src, g.dst)])
    _gz_lines(raw / "node-feat.csv.gz", [",".join(f"{v:.9g}" for v in r) for r in g.features])
    _gz_lines(raw / "node-label.csv.gz", [",".join(str(int(v)) for v in np.atleast_1d(r))
                                          for r in g.labels])
    _gz_lines(raw / "num-node-list.csv.gz", [str(g.num_nodes)])
    _gz_lines(raw / "num-edge-list.csv.gz", [str(g.num_edges)])
    if g.edge_attr is not None:
        _gz_lines(raw / "edge-feat.csv.gz", [",".join(f"{v:.9g}" for v in r)
                                             for r in g.edge_attr])
    write_ogb_splits(root, g.splits)
    return root


def write_ogb_npz(root: Path, g: GraphData, compressed: bool = True) -> Path:
    """OGB npz raw layout (ogbn-papers100M): float16 features, NaN = unlabelled."""
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    save = np.savez_compressed if compressed else np.savez
    extra = {} if g.edge_attr is None else {"edge_feat": g.edge_attr.astype(np.float16)}
    save(raw / "data.npz", edge_index=np.stack([g.src, g.dst]),
         node_feat=g.features.astype(np.float16), num_nodes_list=np.array([g.num_nodes]),
         num_edges_list=np.array([g.num_edges]), **extra)
    lab = g.labels.astype(np.float32).reshape(-1, 1)
    lab[g.labels < 0] = np.nan
    save(raw / "node-label.npz", node_label=lab)
    write_ogb_splits(root, g.splits)
    return root


def write_snap(path: Path, g: GraphData, header: bool = True) -> Path:
    """SNAP edge list (``.gz`` compressed when the name ends in .gz)."""
    lines = []
    if header:
        lines += ["# Directed graph", f"# Nodes: {g.num_nodes} Edges: {g.num_edges}",
                  "# FromNodeId\tToNodeId"]
    lines += [f"{s}\t{d}" for s, d in zip(g.src, g.dst)]
    text = "".join(line + "\n" for line in lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def write_mtx(path: Path, g: GraphData, field: str = "pattern") -> Path:
    """MatrixMarket coordinate general: entry (dst+1, src+1)."""
    lines = [f"%%MatrixMarket matrix coordinate {field} general", "% a comment",
             f"{g.num_nodes} {g.num_nodes} {g.num_edges}"]
    for s, d in zip(g.src, g.dst):
        lines.append(f"{d + 1} {s + 1}" + (" 1.5" if field != "pattern" else ""))
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_reddit(root: Path, g: GraphData) -> Path:
    """The Reddit npz pair PyG reads: reddit_data.npz and reddit_graph.npz (scipy COO)."""
    root.mkdir(parents=True, exist_ok=True)
    types = np.zeros(g.num_nodes, dtype=np.int64)
    for k, t in (("train", 1), ("valid", 2), ("test", 3)):
        types[g.splits[k]] = t
    np.savez(root / "reddit_data.npz", feature=g.features, label=g.labels, node_types=types)
    adj = sp.coo_matrix((np.ones(g.num_edges, dtype=np.float32), (g.src, g.dst)),
                        shape=(g.num_nodes, g.num_nodes))
    sp.save_npz(root / "reddit_graph.npz", adj)
    return root


def multilabel(g: GraphData, tasks: int = 4, seed: int = 0, unlabelled: float = 0.1
               ) -> GraphData:
    """``g`` with multi-label labels [N, tasks] of 0/1 that its classes predict (task t: the
    class id's bit t, for a learnable signal), a few pairs flipped and a share unlabelled (-1)
    — ogbn-proteins' shape of label."""
    rng = np.random.default_rng(seed)
    y = ((g.labels[:, None] >> np.arange(tasks)[None, :]) & 1).astype(np.int8)
    flip = rng.random(y.shape) < 0.1
    y[flip] = 1 - y[flip]
    y[rng.random(y.shape) < unlabelled] = -1
    return GraphData(g.name, g.num_nodes, g.src, g.dst, g.features, y, dict(g.splits),
                     edge_attr=g.edge_attr)


def sparsified(g: GraphData, density: float = 0.15, seed: int = 0) -> GraphData:
    """``g`` with all but a ``density`` share of its feature values zeroed: a bag-of-words
    shaped input for the sparse-feature paths."""
    rng = np.random.default_rng(seed)
    x = np.where(rng.random(g.features.shape) < density, g.features, 0).astype(g.features.dtype)
    return GraphData(g.name, g.num_nodes, g.src, g.dst, x, g.labels, dict(g.splits),
                     edge_attr=g.edge_attr)
