"""The prepared-directory format: every file, dataset and name in it, defined once.

The writer (shard.py and its stages), the reader (loader.py) and the checker (verify.py) all
spell the layout through this module, so changing the format takes one edit here and a bump of
FORMAT_VERSION, which readers check. The same names say what in a directory is prep's own:
``--overwrite`` and a failed run remove those files (:func:`remove_prepared`) and nothing else.

Layout of a prepared directory (format version 1; the manifest describes it fully)::

    manifest.json          written last: its presence means the directory is complete
    nodes.h5               perm_p, perm_q [N] (new position -> original id); labels_P/_Q [N];
                           mask_{train,valid,test}_P/_Q [N] bool; deg_P, deg_Q [N];
                           with --split-index all, mask_{train,valid,test}_P/_Q_<k> [N]
                           bool of stored split k = 1..K-1 (split 0: the plain names)
    A1/rows_00000.h5       tile row-block ti of A1 = P A Q^T; per tile a group t00000..:
    A2/rows_00000.h5       counts [rows] (uint8/16/32: nonzeros per row), anchors [rows/1024+1]
                           int64 (offset of every 1024th row; the last = nnz), indices [nnz]
                           int32 local to the tile (columns ascending per row); deg [rows] int64
    features/rows_00000.h5 x [rows, F], rows of the Q order, chunked for hyperslab reads

Tiles are a T x T grid of ceil(N/T)-sized blocks, independent of any training grid. A1's rows
are in P order and its columns in Q order, A2 the reverse (ROW_ORDER, COL_ORDER): so deg_P is
the row counts of A1 and deg_Q those of A2. A tile file's attributes are matrix, ti, row_lo and
row_hi; a feature file's row_lo and row_hi.

While prep runs, and after an interruption, the directory also holds ``.staging/`` (removed
once the manifest is written)::

    .staging/params.json          options and input of the run (--resume must match them)
    .staging/buckets/A1.p0.*      bucket files of A1, A2 and features (X) by producing rank
    .staging/bucketed.json        {"nparts": ranks}: every rank has finished bucketing
    .staging/done/A1_00000.json   completion record of one unit: its file's bytes and sha256
"""

from __future__ import annotations

import os
import re
from pathlib import Path

FORMAT = "plexgt-prepared"
FORMAT_VERSION = 1
TILE_FORMAT = "counts+anchors"
#: a tile stores the indptr of every ANCHOR-th row (see prep_stages.encode_counts)
ANCHOR = 1024

MANIFEST = "manifest.json"
NODES = "nodes.h5"
FEATURES = "features"
"""Directory of the feature blocks."""

A1, A2 = "A1", "A2"
MATRICES = (A1, A2)
"""The two matrices, each also the directory of its tile row-blocks."""
ROW_ORDER = {A1: "P", A2: "Q"}
COL_ORDER = {A1: "Q", A2: "P"}
ORDERS = ("P", "Q")
SPLITS = ("train", "valid", "test")

# datasets of a tile file (TILE_DEG) and of each tile group in it
TILE_DEG = "deg"
COUNTS = "counts"
ANCHORS = "anchors"
INDICES = "indices"
EDGE_FEAT = "edge_feat"
"""Per tile, beside its indices: [nnz, F_e] float32 features of its edges, in index order."""
# the dataset of a feature file
FEATURES_X = "x"
# or, with feature_layout "csr" (bag-of-words inputs), its rows as CSR: indptr [rows + 1]
# int64 (from 0 in every file), column indices [nnz] int32 (ascending per row), values [nnz]
FEATURES_INDPTR = "x_indptr"
FEATURES_INDICES = "x_indices"
FEATURES_DATA = "x_data"

STAGING = ".staging"
PARAMS = f"{STAGING}/params.json"
BUCKETED = f"{STAGING}/bucketed.json"
BUCKETS = f"{STAGING}/buckets"
DONE = f"{STAGING}/done"
FEATURE_UNIT = "X"
"""Unit kind of a feature block (the others are the matrix names): names its buckets and
completion records."""


def tile_file(matrix: str, ti: int) -> str:
    """Relative path of tile row-block ``ti`` of ``matrix`` ('A1' | 'A2')."""
    return f"{matrix}/rows_{ti:05d}.h5"


def feature_file(b: int) -> str:
    """Relative path of feature block ``b`` (rows [b * feature_block_rows, ...) in Q order)."""
    return f"{FEATURES}/rows_{b:05d}.h5"


def tile_group(tj: int) -> str:
    """Group of tile column ``tj`` inside a tile row-block file."""
    return f"t{tj:05d}"


def data_files(t: int, num_feature_blocks: int) -> list[str]:
    """Every file a complete directory holds besides the manifest, as listed in it."""
    return ([NODES] + [tile_file(k, i) for k in MATRICES for i in range(t)]
            + [feature_file(b) for b in range(num_feature_blocks)])


def perm_ds(order: str) -> str:
    """[N] int64 new position of ``order`` ('P' | 'Q') -> original id, in nodes.h5."""
    return f"perm_{order.lower()}"


P2Q_DS = "p2q"
"""[N] int32 (int64 from 2³¹ nodes) in nodes.h5: the Q position of each P position, what the
node-sequence sampler reads a block at a time instead of both permutations whole (N·16 bytes
on every rank, 1.8 GB for papers100M); directories prepared before it lack it."""


def labels_ds(order: str) -> str:
    """[N] int64 labels (-1 unlabelled) in ``order``, in nodes.h5."""
    return f"labels_{order}"


def mask_ds(split: str, order: str, index: int | None = None) -> str:
    """[N] bool mask of ``split`` in ``order``, in nodes.h5: of the directory's default split
    (``index`` None), or of the source's stored split ``index`` other than it, which only a
    ``prep --split-index all`` directory holds (``mask_train_P_3``): the default names keep
    split 0 there, so readers that know nothing of several splits read one, unchanged."""
    return f"mask_{split}_{order}" if index is None else f"mask_{split}_{order}_{index}"


def deg_ds(order: str) -> str:
    """[N] int64 row counts of the matrix whose rows are in ``order``, in nodes.h5."""
    return f"deg_{order}"


def unit_file(kind: str, i: int) -> str:
    """Relative path of the file prep's unit (``kind`` 'A1' | 'A2' | 'X', index ``i``) builds."""
    return feature_file(i) if kind == FEATURE_UNIT else tile_file(kind, i)


def done_file(kind: str, i: int) -> str:
    """Relative path of the completion record of one unit (``--resume`` skips those)."""
    return f"{DONE}/{kind}_{i:05d}.json"


def bucket_base(kind: str, rank: int) -> str:
    """Relative base path of the bucket files ``rank`` writes for units of ``kind``."""
    return f"{BUCKETS}/{kind}.p{rank}"


def _names(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in patterns))


_ROWS = _names(r"rows_\d{5,}\.h5(\.tmp)?")
_UNIT_KIND = "|".join(re.escape(k) for k in (*MATRICES, FEATURE_UNIT))
OWNED_FILES: dict[str, re.Pattern[str]] = {
    "": _names(*(re.escape(n) + r"(\.tmp)?" for n in (MANIFEST, NODES))),
    A1: _ROWS, A2: _ROWS, FEATURES: _ROWS,
    STAGING: _names(*(re.escape(n.split("/")[-1]) + r"(\.tmp)?" for n in (PARAMS, BUCKETED))),
    BUCKETS: _names(rf"({_UNIT_KIND})\.p\d+\.(idx|\w+\.bin)"),
    DONE: _names(rf"({_UNIT_KIND})_\d{{5,}}\.json(\.tmp)?"),
}
"""Per directory of a prepared directory ('' the top), the names of the files prep writes
there (final and temporary): ``--overwrite`` and a failed run remove those and nothing else."""
OWNED_DIRS: dict[str, tuple[str, ...]] = {
    "": (*MATRICES, FEATURES, STAGING),
    STAGING: tuple(n.split("/")[-1] for n in (BUCKETS, DONE)),
}
"""Per directory, the subdirectories prep makes there."""


def owned_file(parent: str, name: str) -> bool:
    """Whether prep writes a file ``name`` in ``parent`` (relative to the prepared dir)."""
    pat = OWNED_FILES.get(parent)
    return pat is not None and pat.fullmatch(name) is not None


def owned_dir(parent: str, name: str) -> bool:
    """Whether prep makes a directory ``name`` in ``parent``."""
    return name in OWNED_DIRS.get(parent, ())


def remove_prepared(out: Path, rel: str = "", temporary_only: bool = False) -> bool:
    """Remove from ``out`` (``rel``: a directory inside it) the files and directories the
    prepared format names (owned_file, owned_dir), and nothing else; returns whether
    ``rel`` is then empty. Symlinks are unlinked as links, never followed: a symlinked A1
    goes, what it points at stays. ``temporary_only``: only the ``.tmp`` files."""
    left = False
    with os.scandir(out / rel if rel else out) as entries:
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                sub = f"{rel}/{e.name}" if rel else e.name
                if (owned_dir(rel, e.name) and remove_prepared(out, sub, temporary_only)
                        and not temporary_only):
                    os.rmdir(e.path)
                else:
                    left = True
            elif temporary_only:
                if owned_file(rel, e.name) and e.name.endswith(".tmp"):
                    os.unlink(e.path)
                else:
                    left = True
            elif owned_file(rel, e.name) or (e.is_symlink() and owned_dir(rel, e.name)):
                os.unlink(e.path)
            else:
                left = True
    return not left
