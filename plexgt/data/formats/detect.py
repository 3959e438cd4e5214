"""``--format auto``: which reader a path needs, from the path alone (layout, extension, keys).

Why guess at all: a user with a file in hand should not have to learn plexgt's format names
first; a wrong guess is impossible to miss (the reader's own checks refuse the file), and a
path that matches nothing gets a message listing everything that was looked for.
"""

from __future__ import annotations

from pathlib import Path

from plexgt.data.formats.npz_edges import is_edge_npz
from plexgt.data.npzio import npz_keys
from plexgt.data.textio import has_mtx_banner, read_head
from plexgt.errors import DataError

EDGE_LIST_SUFFIXES = (".txt", ".csv", ".tsv", ".edges", ".el", ".edgelist")
LOOKED_FOR = ("a directory holding raw/data.npz or raw/edge.csv.gz (ogb)",
              "a directory of reddit_*.npz or an .npz with adj_data/adj_indices/adj_indptr "
              "(gnn-benchmark)",
              "an .npz with edges or edge_index (npz)",
              "a .mtx[.gz] file, or any file opening with the %%MatrixMarket banner (mtx)",
              f"an edge list {'/'.join(EDGE_LIST_SUFFIXES)}[.gz] (snap when it has a SNAP "
              "'# Nodes: N Edges: E' header, else edgelist)")


def detect_format(path: Path) -> str:
    """The ``--format`` of ``path``; DataError listing what was looked for when none fits."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    if path.is_dir():
        if (path / "raw" / "data.npz").exists() or (path / "raw" / "edge.csv.gz").exists():
            return "ogb"
        if any(path.glob("reddit_*.npz")):
            return "gnn-benchmark"
    else:
        name = path.name.lower()
        stem = name[:-3] if name.endswith(".gz") else name
        if name.endswith(".npz"):
            keys = set(npz_keys(path))
            if {"adj_data", "adj_indices", "adj_indptr"} <= keys:
                return "gnn-benchmark"
            if is_edge_npz(keys):
                return "npz"
            raise DataError(f"{path}: an npz with keys {', '.join(sorted(keys))}; --format "
                            "auto looked for adj_data/adj_indices/adj_indptr (gnn-benchmark) "
                            "or edges/edge_index (npz)")
        if stem.endswith(".mtx"):
            return "mtx"
        head = read_head(path, 4096)
        if has_mtx_banner(head):  # the file says what it is, whatever its name
            return "mtx"
        if stem.endswith(EDGE_LIST_SUFFIXES):
            return "snap" if b"Nodes:" in head and head.lstrip().startswith(b"#") \
                else "edgelist"
    raise DataError(f"{path}: --format auto cannot tell its format; it looked for "
                    + "; ".join(LOOKED_FOR) + " (give --format)")
