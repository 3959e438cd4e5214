"""Options of ``plexgt prep`` and the state one run shares between its stages on one rank.

Why a separate record: every stage (prep_stages.py) needs the same sizes (N, T, tile size,
feature blocks), dtypes and permutations; :meth:`PrepRun.create` derives and checks them all
once, before any rank touches the output directory, so a bad option fails every rank at the
first agreement and leaves nothing behind.
"""

from __future__ import annotations

import errno
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from plexgt.data.permute import inverse, permutations
from plexgt.data.prepared import FEATURE_UNIT, FORMAT_VERSION, MATRICES, done_file, unit_file
from plexgt.data.reciprocity import decide
from plexgt.data.source import FEATURE_NORMALIZATIONS, GraphSource, RowNormalizedFeatures
from plexgt.distributed.hostcomm import HostComm
from plexgt.errors import DataError
from plexgt.util.system import physical_memory

#: target nonzeros per tile when --tiles is not given (bounds the memory of one tile build)
TILE_TARGET_NNZ = 8 << 20
T = TypeVar("T")


@dataclass
class PrepOptions:
    """Options of one prep run (command-line flags of ``plexgt prep``)."""

    out: Path
    tiles: int | None = None
    symmetrize: bool | str = False
    """Add every reverse edge: True / 'yes', False / 'no', or 'auto' (``plexgt prep``'s
    default): when fewer than 1% of the edges have their reverse
    (:mod:`plexgt.data.reciprocity`). This API's default stays False, so a caller's graph is
    stored as given unless it asks."""
    self_loops: bool = True
    features_dtype: str | None = None
    sparse_features: str = "auto"
    """Feature tiles as CSR ('yes'), dense ('no'), or 'auto': CSR when the feature density
    (nonzeros / N·F) is below :data:`SPARSE_DENSITY` (bag-of-words inputs): the density the
    source declares, else the one prep measures on its pass over the features."""
    """'float16' | 'float32' | None (float16 sources stay float16, others become float32)."""
    seed: int = 0
    permutation: str = "random"
    """'auto' (``plexgt prep``'s default: balanced when the graph has at most
    :data:`AUTO_BALANCE_MAX_NNZ` stored nonzeros, else random) | 'random' (uniform, as in
    Plexus; this API's default, so a caller's permutations stay reproducible from the seed
    alone) | 'degree' (stratified by degree: permute.py) | 'balanced' (degree, then refined
    on the edges: equal nnz per block; O(E) memory on rank 0)."""
    balance_blocks: int | None = None
    """'balanced' only: balance the split of N into this many blocks (default
    :func:`default_balance_blocks`: lcm(T, 8), so the T x T tiles and an 8 x 8 grid both)."""
    overwrite: bool = False
    resume: bool = False
    chunk_edges: int = 1 << 21
    flush_items: int | None = None
    """Records a bucket writer buffers before it flushes (default 4 * chunk_edges = 8M)."""
    feature_block_bytes: int = 1 << 28
    progress: bool = True
    source_desc: dict[str, Any] = field(default_factory=dict)
    """How the source was specified (format, input, sizes): recorded, and checked on resume."""
    normalize_features: str = "none"
    """'row': every feature row divided by its sum before it is stored (PyG's
    ``NormalizeFeatures``, which the published Amazon / Coauthor recipes train on; rows
    summing to 0 kept); 'none': stored as the source has them. Recorded in the manifest."""

    def __post_init__(self) -> None:
        """Refuse a bad ``balance_blocks`` here: before the CLI opens (maybe counts) the input."""
        if self.balance_blocks is not None and self.balance_blocks < 1:
            raise DataError(f"--balance-blocks {self.balance_blocks}: must be at least 1")


SPARSE_DENSITY = 0.1
"""Auto layout: CSR feature tiles below this share of nonzeros. A sparse X·W costs about
nnz·d multiply-adds against N·F·d dense, with index traffic on top: Coauthor Physics (0.4%)
gains, Amazon Computers (35%) does not (perf/bench_sparse_features.py)."""


def resolve_sparse(option: str, density: float | None, f: int) -> bool | None:
    """Whether to store CSR feature tiles (:attr:`PrepOptions.sparse_features`); None: 'auto'
    with the density still unknown (prep measures it, then :meth:`PrepRun.set_density`)."""
    if option not in ("auto", "yes", "no"):
        raise DataError(f"--sparse-features {option}: expected auto|yes|no")
    if f == 0:
        return False
    if option == "auto":
        return None if density is None else density < SPARSE_DENSITY
    return option == "yes"


SYMMETRIZE = {"auto": None, "yes": True, "no": False, True: True, False: False}
"""--symmetrize values -> what was asked: True, False, or None (auto: decided from the
measured share of reverse edges)."""


def asked_symmetrize(option: bool | str) -> bool | None:
    """:attr:`PrepOptions.symmetrize` as True / False / None (auto)."""
    if option not in SYMMETRIZE:
        raise DataError(f"--symmetrize {option}: expected auto|yes|no")
    return SYMMETRIZE[option]  # type: ignore[index]


def choose_tiles(n: int, e_hint: int, symmetrize: bool) -> int:
    """Default T: tiles of about TILE_TARGET_NNZ nonzeros, at least 1, at most N."""
    nnz = e_hint * (2 if symmetrize else 1) + n
    return int(min(n, max(1, math.ceil(math.sqrt(nnz / TILE_TARGET_NNZ)))))


def default_balance_blocks(t: int) -> int:
    """The split ``balanced`` targets by default: lcm(T, 8) (T when that exceeds 64).

    Why: the tiles (T) and the common 8-way grids both consist of whole blocks of it, up to a
    row at each boundary; the refinement costs ~blocks^2 per node, hence the cap.
    """
    m = t * 8 // math.gcd(t, 8)
    return m if m <= 64 else t


PERMUTATIONS = ("auto", "random", "degree", "balanced")
AUTO_BALANCE_MAX_NNZ = 20_000_000
"""'auto' refines to 'balanced' up to this many stored nonzeros (edges, symmetrised, plus
self loops): rank 0 then holds about 40 bytes a nonzero (~0.8 GB) and refines in about
1.3 s per million nonzeros (ego-twitter, 1.4M: 1.8 s on the 2-core test VM); beyond it the
uniform random permutation, streamed, which large graphs balance by themselves (Plexus:
papers100M's 8x8 blocks at 1.001 max/mean)."""


def resolve_permutation(asked: str, e_hint: int, n: int, symmetrize: bool, self_loops: bool
                        ) -> str:
    """The permutation a run computes: ``asked``, with 'auto' decided by the graph's size."""
    if asked != "auto":
        return asked
    nnz = e_hint * (2 if symmetrize else 1) + (n if self_loops else 0)
    return "balanced" if nnz <= AUTO_BALANCE_MAX_NNZ else "random"


def check_node_memory(n: int, name: str) -> None:
    """Refuse an N whose node arrays (~40 bytes a node) exceed this machine's memory.

    Why: N can come from a header (.mtx sizes, OGB num-node-list) whose claim no edge can
    confirm (isolated nodes are legal); allocating from it unchecked would end in a crash.
    """
    phys = physical_memory()
    if phys is not None and 40 * n > phys:
        raise DataError(f"{name}: N={n} nodes need ~{40 * n / 2**30:.0f} GiB of node arrays, "
                        f"more than this machine's {phys / 2**30:.0f} GiB (bad header?)")


@dataclass
class PrepRun:
    """One prep run on one rank: its input, options, sizes and (once set) permutations.

    Everything but the permutations and ``balance_info`` is fixed by :meth:`create`; the
    permutation stage sets those (``random`` already in :meth:`create`: it needs no edges).
    """

    src: GraphSource
    opts: PrepOptions
    comm: HostComm
    n: int
    """N: nodes."""
    t: int
    """T: tiles per side of each matrix (a T x T grid)."""
    size: int
    """ceil(N/T): rows (and columns) of a tile."""
    idx_dtype: np.dtype
    """Of tile indices and the inverse permutations: int32 while N < 2^31, else int64."""
    f: int
    """F: feature columns (0: no features)."""
    fdtype: np.dtype
    """Of the stored features: float16 | float32."""
    fb: int
    """Rows of a feature block: about feature_block_bytes, at most a tile's rows."""
    nfb: int
    """Feature blocks (0 without features)."""
    balance_blocks: int
    """The split ``balanced`` actually balances (recorded in params); 0 for the others."""
    params: dict[str, Any]
    """Options and input as recorded in .staging/params.json and the manifest: ``--resume``
    continues a run only when they are equal."""
    units: list[tuple[str, int]]
    """(kind, index) of every file the build stage writes: A1 and A2 row blocks, then the
    feature blocks (kind 'X'); unit k belongs to rank k % ranks."""
    pinv: np.ndarray
    """[N] inverse of perm_p (original id -> P position), idx_dtype; empty until set."""
    qinv: np.ndarray
    """[N] inverse of perm_q, likewise."""
    permutation: str = "random"
    """The permutation this run computes: the option, with 'auto' resolved."""
    balance_info: dict[str, Any] = field(default_factory=dict)
    """``balanced`` only, rank 0: what the refinement reports (recorded in the manifest)."""
    sparse: bool | None = False
    """Feature blocks are stored as CSR (:func:`resolve_sparse`); None until the measured
    density decides (before the build stage, alike on every rank)."""
    feature_density: float | None = None
    """Nonzeros / (N·F) of the features: the source's own figure, or measured by prep."""
    asked_symmetrize: bool | None = False
    """What :attr:`PrepOptions.symmetrize` asked: True, False, None (auto)."""
    symmetrize: bool | None = None
    """Whether the stored graph holds every reverse edge: decided (:meth:`set_reciprocity`)
    before the build stage, by the same agreement on every rank; None until then."""
    reciprocity: dict[str, Any] = field(default_factory=dict)
    """The measured share of edges with their reverse (:mod:`plexgt.data.reciprocity`)."""

    @property
    def sym_bound(self) -> bool:
        """Whether the stored edges may be symmetrized (sizes before the decision)."""
        return self.asked_symmetrize is not False if self.symmetrize is None else self.symmetrize

    def set_density(self, density: float) -> None:
        """Record the measured feature density (identical on every rank); decide 'auto'."""
        self.feature_density = density
        if self.sparse is None:
            self.sparse = density < SPARSE_DENSITY

    def set_reciprocity(self, info: dict[str, Any]) -> None:
        """Record the measured reciprocity (identical on every rank) and decide."""
        self.reciprocity = dict(info)
        self.symmetrize = decide(self.asked_symmetrize, info)

    @classmethod
    def create(cls, source: GraphSource, opts: PrepOptions, comm: HostComm) -> PrepRun:
        """Check ``opts`` against ``source`` (:class:`DataError`) and fix every size."""
        n = source.num_nodes
        if n <= 0:
            raise DataError(f"{source.name}: empty graph (0 nodes)")
        if opts.normalize_features not in FEATURE_NORMALIZATIONS:
            raise DataError(f"--normalize-features {opts.normalize_features}: expected "
                            f"{'|'.join(FEATURE_NORMALIZATIONS)}")
        if opts.normalize_features == "row" and source.num_features:
            source = RowNormalizedFeatures(source)
        check_node_memory(n, source.name)
        asked = asked_symmetrize(opts.symmetrize)
        sym_bound = asked is not False  # sizes: auto may double the edges
        t = opts.tiles if opts.tiles is not None else choose_tiles(
            n, source.num_edges_hint(), sym_bound)
        if t < 1 or t > n:
            raise DataError(f"--tiles {t}: must be in [1, N={n}]")
        size = math.ceil(n / t)
        idx_dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
        f = source.num_features
        if opts.features_dtype not in (None, "float16", "float32"):
            raise DataError(f"--features-dtype {opts.features_dtype}: expected float16|float32")
        fd = opts.features_dtype or (
            "float16" if source.feature_dtype == np.dtype(np.float16) else "float32")
        fdtype = np.dtype(fd)
        row_bytes = max(1, f * fdtype.itemsize)
        fb = max(1, min(size, opts.feature_block_bytes // row_bytes))
        nfb = math.ceil(n / fb) if f else 0
        if opts.permutation not in PERMUTATIONS:
            raise DataError(f"--permutation {opts.permutation}: expected "
                            f"{'|'.join(PERMUTATIONS)}")
        perm = resolve_permutation(opts.permutation, source.num_edges_hint(), n,
                                   sym_bound, opts.self_loops)
        balance_blocks = 0
        if perm == "balanced":
            b = opts.balance_blocks if opts.balance_blocks is not None else \
                default_balance_blocks(t)
            balance_blocks = min(b, n)
        params = {
            "format_version": FORMAT_VERSION, "source": opts.source_desc, "N": n, "T": t,
            "symmetrized": "auto" if asked is None else asked, "self_loops": opts.self_loops,
            "features_dtype": fd, "seed": opts.seed, "F": f, "feature_block_rows": fb,
            "permutation": perm,
        }
        if balance_blocks:
            params["balance_blocks"] = balance_blocks
        if opts.normalize_features != "none":  # absent at 'none': older runs' params stand
            params["normalize_features"] = opts.normalize_features
        if source.num_edge_features:
            params["FE"] = source.num_edge_features
        density = source.feature_density() if f else None
        sparse = resolve_sparse(opts.sparse_features, density, f)
        params["feature_layout"] = "auto" if sparse is None else "csr" if sparse else "dense"
        units = ([(k, i) for k in MATRICES for i in range(t)]
                 + [(FEATURE_UNIT, i) for i in range(nfb)])
        empty = np.empty(0, dtype=idx_dtype)
        run = cls(source, opts, comm, n, t, size, idx_dtype, f, fdtype, fb, nfb, balance_blocks,
                  params, units, empty, empty, perm, sparse=sparse, feature_density=density,
                  asked_symmetrize=asked)
        if perm == "random":
            run.set_perms(*permutations(n, opts.seed))
        return run

    @property
    def fe(self) -> int:
        """F_e: edge feature columns (0: none), kept in every tile beside its indices."""
        return self.src.num_edge_features

    def set_perms(self, p: np.ndarray, q: np.ndarray) -> None:
        """Take (perm_p, perm_q), new position -> original id; keep their inverses."""
        self.pinv, self.qinv = inverse(p).astype(self.idx_dtype), inverse(q).astype(self.idx_dtype)

    @property
    def out(self) -> Path:
        """The prepared directory."""
        return Path(self.opts.out)

    def path(self, rel: str) -> Path:
        """``rel`` (a name of prepared.py) inside the prepared directory."""
        return self.out / rel

    def local(self, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` on this rank and agree with the others (:meth:`HostComm.run`), a full disk
        turned into a :class:`DataError` first. Why here: agreement re-raises a DataError as a
        DataError on every rank, anything else as a RuntimeError on the others, so the rank
        whose write failed raised an OSError, the others a RuntimeError, and none cleaned up."""
        def guarded() -> T:
            try:
                return fn()
            except OSError as e:
                if not disk_full(e, self.out):
                    raise
                raise self.disk_full_error(e) from None

        return self.comm.run(guarded)

    def disk_full_error(self, e: OSError) -> DataError:
        """The one line a full disk gets: where, and what the whole prep needs there."""
        return DataError(f"{e.filename or self.out}: the disk is full; prep needs about "
                         f"{prep_bytes(self) / 2**30:.3g} GiB there")

    def unit_path(self, kind: str, i: int) -> Path:
        return self.path(unit_file(kind, i))

    def done_path(self, kind: str, i: int) -> Path:
        return self.path(done_file(kind, i))


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def disk_full(e: OSError, out: Path) -> bool:
    """Whether a write failed for want of space (numpy's short writes carry no errno: then
    whether the disk is all but full)."""
    if e.errno in NO_SPACE:
        return True
    if e.errno is not None:
        return False
    try:
        st = os.statvfs(out if out.exists() else out.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < (1 << 20)


def feature_chunk(rows: int, f: int, itemsize: int) -> tuple[int, int]:
    """(rows, columns) of a dense feature block's chunks: at most 64 columns, ~256 KiB."""
    cols = max(1, min(f, 64))
    return max(1, min(rows, (256 << 10) // (cols * itemsize))), cols


PAGE = 4096
"""Allocation unit assumed per file (a small file takes a whole block)."""
H5_OBJECT = 4096
"""HDF5 bytes per dataset or group beyond its data (object header, chunk index), a bound
taken from the files prep writes (~2.5 KiB a dataset)."""


def prep_bytes(run: PrepRun) -> int:
    """About the most a prep holds on disk at once: just before the staging area goes, every
    bucket and every output file exist together. Counted: the edge buckets of A1 and A2 (row
    and column ids, edge features, segment index), the feature buckets (Q position and row,
    unless the source reads rows by id), both matrices' tiles (indices, edge features, row
    counts of up to 2 bytes, degrees, HDF5 objects), the feature blocks (dense: whole chunks,
    as HDF5 stores the last one, also while 'auto' awaits the measured density: below the
    CSR threshold dense is the larger; CSR: indptr, indices, values at the density), the
    node arrays, and the small records (completion records, JSON) a block each."""
    n, t, f, w, o = run.n, run.t, run.f, run.comm.size, run.opts
    e_in = run.src.num_edges_hint() + (n if o.self_loops else 0)  # bucketed: as given
    e = run.src.num_edges_hint() * (2 if run.sym_bound else 1) + (n if o.self_loops else 0)
    idx, fd, fe = run.idx_dtype.itemsize, run.fdtype.itemsize, run.fe
    flush = o.flush_items or 4 * o.chunk_edges
    files = 8 + 2 * len(run.units) + w * (2 * (3 + (1 if fe else 0)) + 3)
    # edge buckets: one record an edge in each matrix; a segment per tile per flush per rank
    total = 2 * (e_in * (2 * idx + 4 * fe) + 24 * t * t * (e_in // flush + w))
    if f and not run.src.random_access_features:
        row = 8 + f * fd
        total += n * row + 24 * run.nfb * (n * row // (128 << 20) + w)
    # tiles: per matrix T row-block files of T tiles (counts, anchors, indices[, edge_feat])
    per_tile = 3 + (1 if fe else 0) + 1
    total += 2 * (e * (idx + 4 * fe) + n * t * 2 + n * 8 + 8 * t * (n // 1024 + 2)
                  + t * (t * per_tile + 2) * H5_OBJECT)
    for rows, count in ((run.fb, n // run.fb), (n % run.fb, 1)):  # full blocks, the last
        if not (f and rows and count):
            continue
        if run.sparse:
            dens = min(1.0, run.feature_density or 1.0)
            block = 8 * (rows + 1) + int(rows * f * dens * (4 + fd)) + 4 * H5_OBJECT
        else:
            cr, cc = feature_chunk(rows, f, fd)
            block = -(-rows // cr) * -(-f // cc) * (cr * cc * fd + 4) + 2 * H5_OBJECT
        total += count * block
    total += 70 * n + 20 * H5_OBJECT  # nodes.h5: perms, labels, degrees, masks in P and Q
    return total + files * PAGE
