"""OGB node-property raw layouts (the files OGB downloads, read without the ogb package).

Two layouts, told apart by what ``ROOT/raw`` holds:

- csv.gz (ogbn-arxiv, ogbn-products): ``edge.csv.gz`` (``src,dst`` per line),
  ``node-feat.csv.gz`` (F comma-separated floats per line), ``node-label.csv.gz``,
  ``num-node-list.csv.gz``, ``num-edge-list.csv.gz``.
- npz (ogbn-papers100M): ``data.npz`` with ``edge_index`` int64 [2, E], ``node_feat`` [N, F]
  (float16), ``num_nodes_list``, ``num_edges_list``; ``node-label.npz`` with ``node_label``
  float [N, 1] (NaN = unlabelled).

Splits: ``ROOT/split/NAME/{train,valid,test}.csv.gz`` (one node id per line). Edges are read
as stored (a pair ``a,b`` is the message a -> b); prep's ``--symmetrize auto`` adds the reverse
edges when almost none are present (a citation graph), ``--no-symmetrize`` keeps them directed.
Both layouts are streamed (:class:`OgbNpzSource`, :class:`OgbCsvSource`): edges and feature
rows are read in chunks, so neither papers100M nor products has to fit in memory; labels and
splits (node-sized arrays) are read whole.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from plexgt.data.formats.spec import FormatSpec, Probe, option
from plexgt.data.graph import GraphData, first_id_error, node_labels
from plexgt.data.npzio import NpzArray, npz_keys, require_arrays
from plexgt.data.source import (
    GraphSource,
    TextEdgeSource,
    check_finite,
    check_ids,
    collect_edges,
)
from plexgt.data.textio import (
    BLOCK_BYTES,
    Block,
    block_bytes_for,
    empty_lines,
    first_data_line,
    iter_blocks,
    iter_rows,
    lockstep,
    max_data_lines,
    parse,
    read_all_rows,
)
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError

SPLIT_KEYS = ("train", "valid", "test")


def _layout(root: Path) -> str:
    raw = root / "raw"
    if (raw / "data.npz").exists():
        return "npz"
    if (raw / "edge.csv.gz").exists():
        return "csv"
    if not root.exists():
        raise DataError(f"{root}: no such directory")
    raise DataError(f"{root}: neither raw/data.npz nor raw/edge.csv.gz found (not an OGB root)")


def _one_count(path: Path, what: str) -> int:
    rows = read_all_rows(path, ncols=1, dtype=np.int64, delimiter=",")
    if rows.shape[0] != 1:
        raise DataError(f"{path}: holds {rows.shape[0]} {what} counts; a node-property dataset "
                        "has exactly one graph")
    v = int(rows[0, 0])
    if v <= 0:
        raise DataError(f"{path}: {what} count {v} is not positive")
    return v


def _labels_from_float(lab: np.ndarray, n: int, where: str) -> np.ndarray:
    """[N] class ids of one label column (NaN = unlabelled), or multi-label [N, T] of T >= 2
    columns (ogbn-proteins' 112 binary tasks)."""
    lab = np.asarray(lab, dtype=np.float64).reshape(lab.shape[0], -1)
    if lab.shape[0] != n:
        raise DataError(f"{where}: {lab.shape[0]} labels disagree with N={n}")
    if lab.shape[1] > 1:
        return node_labels(lab, where)
    lab = lab[:, 0]
    known = np.isfinite(lab)
    if np.any(lab[known] < 0) or np.any(lab[known] != np.round(lab[known])):
        raise DataError(f"{where}: labels must be non-negative integers (NaN = unlabelled)")
    out = np.full(n, -1, dtype=np.int64)
    out[known] = lab[known].astype(np.int64)
    return out


def read_splits(root: Path, n: int, split: str | None = None) -> dict[str, np.ndarray]:
    """{train, valid, test} node ids from ``ROOT/split/NAME`` ({} when there is no split dir)."""
    base = root / "split"
    if not base.is_dir():
        return {}
    names = sorted(p.name for p in base.iterdir() if p.is_dir())
    if split is None:
        if not names:
            return {}
        split = names[0]
    if split not in names:
        raise DataError(f"{base}: no split {split!r} (found: {', '.join(names) or 'none'})")
    out = {}
    for key in SPLIT_KEYS:
        path = base / split / f"{key}.csv.gz"
        ids = read_all_rows(path, ncols=1, dtype=np.int64, delimiter=",")[:, 0]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids[(ids < 0) | (ids >= n)][0])
            raise DataError(f"{path}: node id {bad} is outside [0, {n})")
        out[key] = ids
    return out


def split_origin(root: Path, split: str | None) -> dict[str, Any]:
    """The manifest's record of the split :func:`read_splits` read: its directory."""
    base = root / "split"
    name = split or min((p.name for p in base.iterdir() if p.is_dir()), default="")
    return {"origin": "file", "path": str((base / name).resolve())}


class OgbCsvSource(TextEdgeSource):
    """The csv.gz layout streamed: edges and feature rows parsed block by block, never whole.

    N comes from num-node-list.csv.gz; the edge count claimed by num-edge-list.csv.gz is
    checked at the end of a pass. Feature rows are numbered by position (one row per line,
    empty lines skipped; comment or whitespace-only lines are refused), so every part
    decompresses the whole feature file to count rows, parsing only its own blocks. Labels and
    splits (node-sized) are read whole.
    """

    def __init__(self, root: Path, split: str | None = None) -> None:
        raw = root / "raw"
        self.name = str(root)
        self.num_nodes = n = _one_count(raw / "num-node-list.csv.gz", "node")
        self.claimed_e = _one_count(raw / "num-edge-list.csv.gz", "edge")
        self.edge_path = raw / "edge.csv.gz"
        self.files = [raw / "num-node-list.csv.gz", raw / "num-edge-list.csv.gz", self.edge_path]
        self.feat_path: Path | None = None
        if (raw / "node-feat.csv.gz").exists():
            p = self.feat_path = raw / "node-feat.csv.gz"
            line = first_data_line(p)
            if not line:
                raise DataError(f"{p}: 0 feature rows disagree with N={n}")
            self.num_features = len(line.split(b","))
            self.feature_dtype = np.dtype(np.float32)
            self._row_bytes = len(line)
            self.files.append(p)
        self._labels = None
        if (raw / "node-label.csv.gz").exists():
            p = raw / "node-label.csv.gz"
            tasks = max(1, len(first_data_line(p).split(b",")))
            self._labels = _labels_from_float(
                read_all_rows(p, ncols=tasks, dtype=np.float64, delimiter=","), n, str(p))
            self.files.append(p)
        self._splits = read_splits(root, n, split)
        self._split_origin = split_origin(root, split) if self._splits else {}
        self.edge_feat_path: Path | None = None
        if (raw / "edge-feat.csv.gz").exists():
            p = self.edge_feat_path = raw / "edge-feat.csv.gz"
            line = first_data_line(p)
            if not line:
                raise DataError(f"{p}: no edge feature rows")
            self.num_edge_features = len(line.split(b","))
            self.files.append(p)

    def num_edges_hint(self) -> int:
        return min(self.claimed_e, max_data_lines(self.edge_path))

    def edge_attr_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        """Both files read in lockstep, cut into pieces of ``chunk`` edges, piece k to part
        k % nparts: every part decompresses and parses both (lines of two files cannot be
        matched up without counting them), and keeps only its pieces."""
        p, n = self.edge_feat_path, self.num_nodes
        assert p is not None, f"{self.name}: no edge features"
        edges = (r for _, r in iter_rows(self.edge_path, ncols=2, dtype=np.int64,
                                         delimiter=","))
        feats = (r for _, r in iter_rows(p, ncols=self.num_edge_features, dtype=np.float32,
                                         delimiter=","))
        pos = 0
        for k, (e, f) in enumerate(lockstep(edges, feats, chunk, self.edge_path, p)):
            if k % nparts == part:
                src, dst = np.ascontiguousarray(e.T)
                check_ids(src, dst, n, f"{self.edge_path}: edges [{pos}, {pos + src.size})")
                check_finite(f, pos, f"{p}: edge features (row = edge)")
                yield src, dst, f
            pos += e.shape[0]
        self._check_total(pos)
        self._pass = pos if part == 0 else 0  # every part counted all: the sum is one pass

    def _check_total(self, count: int) -> None:
        if count != self.claimed_e:
            raise DataError(f"{self.edge_path}: holds {count} edges but num-edge-list.csv.gz "
                            f"claims {self.claimed_e}")

    def _edge_blocks(self, part, nparts, block_bytes):  # noqa: ANN001, ANN202 - see base
        path, n = self.edge_path, self.num_nodes
        for blk in iter_blocks(path, part, nparts, block_bytes=block_bytes):
            arr = parse(blk, ncols=2, dtype=np.int64, delimiter=",")
            if not arr.size:
                continue
            src, dst = np.ascontiguousarray(arr.T)
            bad = first_id_error(src, dst, 0, n)
            if bad is not None:
                r, what, v = bad
                raise DataError(f"{path}: line {blk.data_line(r)}: edge {what} id {v} is "
                                f"outside [0, {n})")
            yield src, dst, src.size

    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        p, n, f = self.feat_path, self.num_nodes, self.num_features
        if p is None:
            return
        chunk_rows = max(1, chunk_rows)
        row, over = 0, False
        for blk in iter_blocks(p, part, nparts, others=True,
                               block_bytes=block_bytes_for(chunk_rows, self._row_bytes)):
            k = blk.data.count(b"\n") - empty_lines(blk.data)
            x = None
            if blk.mine and not over:
                x = parse(blk, ncols=f, dtype=np.float32, delimiter=",")
                if x.shape[0] != k:
                    raise DataError(f"{p}: line {_skipped_line(blk)}: comment or blank line "
                                    "(feature files hold one row per line)")
            over = over or row + k > n  # then only count on, for the message
            if x is not None and not over:
                check_finite(x, row, str(p))
                for lo in range(0, k, chunk_rows):
                    yield row + lo, x[lo : lo + chunk_rows]
            row += k
        if row != n:
            raise DataError(f"{p}: {row} feature rows disagree with N={n}")

    def labels(self) -> np.ndarray | None:
        return self._labels

    def splits(self) -> dict[str, np.ndarray]:
        return dict(self._splits)

    def split_origin(self) -> dict[str, Any]:
        return dict(self._split_origin)


def _skipped_line(blk: Block) -> int:
    """Line number of the first non-empty line of ``blk`` that ``np.loadtxt`` skipped."""
    for k, raw in enumerate(blk.data.split(b"\n")[:-1]):
        if raw and not raw.split(b"#", 1)[0].strip():
            return blk.first_line() + k
    return blk.first_line()


class OgbNpzSource(GraphSource):
    """The npz layout streamed: edges and feature rows are read in chunks, never whole."""

    def __init__(self, root: Path, split: str | None = None) -> None:
        raw = root / "raw"
        data = raw / "data.npz"
        keys = npz_keys(data)
        require_arrays(data, keys, ("edge_index", "num_nodes_list"))
        self.name = str(root)
        self.files = [data]
        nn = NpzArray(data, "num_nodes_list").read_all().ravel()
        if nn.size != 1 or int(nn[0]) <= 0:
            raise DataError(f"{data}: num_nodes_list must hold one positive count, got {nn[:4]}")
        self.num_nodes = n = int(nn[0])
        self.edge_index = NpzArray(data, "edge_index")
        if len(self.edge_index.shape) != 2 or self.edge_index.shape[0] != 2:
            raise DataError(
                f"{data}: edge_index has shape {self.edge_index.shape}; expected [2, E]")
        if not np.issubdtype(self.edge_index.dtype, np.integer):
            raise DataError(f"{data}: edge_index has dtype {self.edge_index.dtype}; expected int")
        self.num_edges = self.edge_index.shape[1]
        if self.num_edges == 0:
            raise DataError(f"{data}: empty graph (no edges)")
        if "num_edges_list" in keys:
            ne = NpzArray(data, "num_edges_list").read_all().ravel()
            if ne.size != 1 or int(ne[0]) != self.num_edges:
                raise DataError(f"{data}: num_edges_list claims {ne[:4]} edges but edge_index "
                                f"holds {self.num_edges}")
        self.edge_feat = None
        if "edge_feat" in keys:
            self.edge_feat = NpzArray(data, "edge_feat")
            if len(self.edge_feat.shape) != 2 or self.edge_feat.shape[0] != self.num_edges:
                raise DataError(f"{data}: edge_feat has shape {self.edge_feat.shape}; expected "
                                f"[E={self.num_edges}, F_e]")
            if self.edge_feat.dtype.kind != "f":
                raise DataError(f"{data}: edge_feat has dtype {self.edge_feat.dtype}; "
                                "expected float")
            self.num_edge_features = self.edge_feat.shape[1]
        self.feat = None
        if "node_feat" in keys:
            self.feat = NpzArray(data, "node_feat")
            if len(self.feat.shape) != 2 or self.feat.shape[0] != n:
                raise DataError(f"{data}: node_feat has shape {self.feat.shape}; feature rows "
                                f"disagree with N={n}")
            if self.feat.dtype.kind != "f":
                raise DataError(f"{data}: node_feat has dtype {self.feat.dtype}; expected float")
            self.num_features = self.feat.shape[1]
            self.feature_dtype = self.feat.dtype
        self._labels = None
        lab_path = raw / "node-label.npz"
        if lab_path.exists():
            self.files.append(lab_path)
            arr = NpzArray(lab_path, "node_label")
            if arr.shape[0] != n:
                raise DataError(f"{lab_path}: {arr.shape[0]} labels disagree with N={n}")
            self._labels = _labels_from_float(arr.read_all(), n, str(lab_path))
        self._splits = read_splits(root, n, split)
        self._split_origin = split_origin(root, split) if self._splits else {}

    def num_edges_hint(self) -> int:
        return self.num_edges

    def edge_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        e = self.num_edges
        lo, hi = e * part // nparts, e * (part + 1) // nparts
        srcs = self.edge_index.iter_flat(lo, hi, chunk)
        dsts = self.edge_index.iter_flat(e + lo, e + hi, chunk)
        pos = lo
        for s, d in zip(srcs, dsts):
            s, d = s.astype(np.int64), d.astype(np.int64)
            check_ids(s, d, self.num_nodes, f"{self.edge_index.path}: edge_index[:, {pos}:]")
            pos += s.size
            yield s, d

    def edge_attr_chunks(self, part, nparts, chunk):  # noqa: ANN001, ANN201 - see base
        assert self.edge_feat is not None, f"{self.name}: no edge features"
        fe, e = self.num_edge_features, self.num_edges
        lo = e * part // nparts
        hi = e * (part + 1) // nparts
        feats = self.edge_feat.iter_flat(lo * fe, hi * fe, max(1, chunk) * fe)
        pos = lo
        for (s, d), flat in zip(self.edge_chunks(part, nparts, chunk), feats):
            f = flat.reshape(-1, fe).astype(np.float32)
            check_finite(f, pos, f"{self.edge_feat.path}: edge_feat (row = edge)")
            pos += s.size
            yield s, d, f

    def feature_chunks(self, part, nparts, chunk_rows):  # noqa: ANN001, ANN201 - see base
        if self.feat is None:
            return
        n, f = self.num_nodes, self.num_features
        lo, hi = n * part // nparts, n * (part + 1) // nparts
        row = lo
        for flat in self.feat.iter_flat(lo * f, hi * f, max(1, chunk_rows) * f):
            rows = flat.reshape(-1, f)
            check_finite(rows, row, f"{self.feat.path}: node_feat")
            yield row, rows
            row += rows.shape[0]

    def labels(self) -> np.ndarray | None:
        return self._labels

    def splits(self) -> dict[str, np.ndarray]:
        return dict(self._splits)

    def split_origin(self) -> dict[str, Any]:
        return dict(self._split_origin)

    def close(self) -> None:
        self.edge_index.close()
        if self.edge_feat is not None:
            self.edge_feat.close()
        if self.feat is not None:
            self.feat.close()


def open_ogb(root: str | Path, split: str | None = None) -> GraphSource:
    """A streaming source for an OGB root directory (either layout)."""
    root = Path(root)
    if _layout(root) == "npz":
        return OgbNpzSource(root, split)
    return OgbCsvSource(root, split)


def read_ogb(root: str | Path, split: str | None = None) -> GraphData:
    """Read an OGB node-property root (either layout) into memory, validated."""
    root = Path(root)
    if _layout(root) == "csv":
        return _read_csv(OgbCsvSource(root, split))
    src = OgbNpzSource(root, split)
    try:
        e = src.num_edges
        ei = src.edge_index.read_all().astype(np.int64)
        check_ids(ei[0], ei[1], src.num_nodes, str(src.edge_index.path))
        feats = None
        if src.feat is not None:
            feats = src.feat.read_all()
            check_finite(feats, 0, f"{src.feat.path}: node_feat")
        attr = None
        if src.edge_feat is not None:
            attr = src.edge_feat.read_all().astype(np.float32)
        g = GraphData(str(root), src.num_nodes, ei[0].copy(), ei[1].copy(), feats,
                      src.labels(), src.splits(), edge_attr=attr)
        assert g.num_edges == e
    finally:
        src.close()
    g.validate()
    return g


def _read_csv(src: OgbCsvSource) -> GraphData:
    """The csv layout in memory: the concatenation of the source's chunks."""
    attr = None
    if src.num_edge_features:
        parts = list(src.edge_attr_chunks(0, 1, 1 << 20))
        s, d = collect_edges((a, b) for a, b, _ in parts)
        attr = np.concatenate([f for *_, f in parts])
    else:
        s, d = collect_edges(src.edge_chunks(0, 1, BLOCK_BYTES))
    feats = None
    if src.feat_path is not None:
        feats = np.empty((src.num_nodes, src.num_features), dtype=np.float32)
        for row, x in src.feature_chunks(0, 1, 1 << 20):
            feats[row : row + x.shape[0]] = x
    g = GraphData(src.name, src.num_nodes, s, d, feats, src.labels(), src.splits(),
                  edge_attr=attr)
    g.validate()
    return g


SPLIT = option("--split", "OGB split directory name (default: the first found)",
               refused="--split names an OGB split directory; --format {fmt} has none")


def _recognise(probe: Probe) -> bool:
    return probe.holds("raw/data.npz", "raw/edge.csv.gz")


def _open(args: argparse.Namespace, comm: HostComm | None) -> GraphSource:
    return open_ogb(args.input, args.split)


SPEC = FormatSpec(
    "ogb", "OGB node-property raw layouts (csv.gz, or papers100M's npz), streamed", _open,
    input="the dataset root directory", recognise=_recognise, order=10,
    looked_for="a directory holding raw/data.npz or raw/edge.csv.gz", options=(SPLIT,))
