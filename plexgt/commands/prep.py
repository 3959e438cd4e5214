"""``plexgt prep``: shard a dataset once into a prepared directory (see plexgt/data/shard.py).

Runs as one process or under ``mpiexec`` (ranks share the work; the output is identical).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plexgt.data.formats.detect import detect_format
from plexgt.data.formats.edgelist import EdgeListSource, detect_layout
from plexgt.data.formats.gnn_benchmark import read_gnn_benchmark
from plexgt.data.formats.mtx import MtxSource
from plexgt.data.formats.node_table import NodeTable, NodeTableSource, count_rows
from plexgt.data.formats.npz_edges import read_edge_npz
from plexgt.data.formats.ogb import open_ogb
from plexgt.data.formats.snap import SnapSource
from plexgt.data.runtime import world_comm
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import GeneratedFeatures, MemorySource
from plexgt.data.synthetic import RmatSource, sbm
from plexgt.errors import UsageError

HELP = "Shard a dataset into adjacency tiles, features and node arrays (out of core, MPI)."
FORMATS = ("auto", "gnn-benchmark", "ogb", "npz", "snap", "edgelist", "mtx", "rmat", "sbm")
SYNTHETIC = ("rmat", "sbm")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="auto", choices=FORMATS,
                   help="input format (default auto: from the --input path; the generators "
                   "rmat and sbm are named)")
    p.add_argument("--input", type=Path, help="input file (OGB: the dataset root directory; "
                   "gnn-benchmark: an .npz, or the Reddit directory of reddit_*.npz)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--tiles", type=int, help="tiles per side T (default: ~8M nonzeros a tile)")
    p.add_argument("--symmetrize", action="store_true", help="add every reverse edge")
    p.add_argument("--no-self-loops", action="store_true", help="do not add self loops")
    p.add_argument("--sparse-features", choices=("auto", "yes", "no"), default="auto",
                   help="store features as CSR tiles that train sparse (X·W as SpMM): auto = "
                   "when the source's density is known and below 10%% (bag-of-words)")
    p.add_argument("--features-dtype", choices=("float16", "float32"),
                   help="stored feature dtype (default: float16 sources stay float16, "
                   "others float32)")
    p.add_argument("--seed", type=int, default=0, help="permutation / generator seed")
    p.add_argument("--permutation", choices=("auto", "random", "degree", "balanced"),
                   default="auto",
                   help="auto (default): balanced up to 2e7 stored nonzeros, else random; "
                   "random: uniform P, Q (Plexus); degree: P, Q stratified by degree, "
                   "for tighter block balance on small power-law graphs (one extra edge pass); "
                   "balanced: degree, then refined until every block of the --balance-blocks "
                   "split holds the same nnz (rank 0 holds all edges in memory: for graphs up "
                   "to ~1e8 edges, where random is not balanced enough)")
    p.add_argument("--balance-blocks", type=int, default=None, metavar="B",
                   help="--permutation balanced: balance the B x B split (blocks of ceil(N/B); "
                   "default lcm(T, 8), or T when that exceeds 64)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output dir")
    p.add_argument("--resume", action="store_true", help="complete an interrupted run")
    g = p.add_argument_group("sizes (rmat, sbm; --features/--classes also generate random "
                             "features/labels for featureless inputs)")
    g.add_argument("--nodes", type=int, help="number of nodes (snap: fixes N, and skips the "
                   "counting pass that otherwise parses the whole file once to find N)")
    g.add_argument("--edges", type=int, help="number of edges")
    g.add_argument("--classes", type=int, help="number of classes")
    g.add_argument("--features", type=int, help="feature dimension")
    g.add_argument("--edge-features", type=int, help="rmat, sbm: edge feature dimension (sbm: "
                   "column 0 marks edges inside a community); kept with the tiles")
    p.add_argument("--split", help="OGB split directory name (default: the first found)")
    p.add_argument("--split-index", type=int, default=0,
                   help="npz: which of several stored splits (masks [K, N]) to use")
    e = p.add_argument_group("edgelist (delimited src,dst[,weight] lines; detected unless "
                             "given)")
    e.add_argument("--delimiter", choices=("comma", "tab", "space"),
                   help="field separator (default: detected from the first line)")
    hdr = e.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_const", const=True,
                     help="the first line names the columns")
    hdr.add_argument("--no-header", dest="header", action="store_const", const=False,
                     help="the first line is an edge")
    e.add_argument("--one-based", action="store_true", help="ids count from 1")
    e.add_argument("--node-table", type=Path, help="CSV or Parquet table of the nodes (one row "
                   "each; N is its row count): their labels and features")
    e.add_argument("--id-column", default="id", help="--node-table: the node id column")
    e.add_argument("--label-column", help="--node-table: the class id column, or several "
                   "(a,b,c or prefix*): one 0/1 task each (multi-label)")
    e.add_argument("--feature-columns", help="--node-table: feature columns, 'a,b,c' or a "
                   "prefix 'feat_*'")
    p.add_argument("--chunk-edges", type=int, default=1 << 21,
                   help="edges per streamed chunk: bounds prep's streaming memory (text parse "
                   "blocks of ~16 bytes an edge, bucket buffers of 4 chunks)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _check_format_options(args: argparse.Namespace, fmt: str) -> None:
    """Refuse an option that ``fmt`` would ignore: a run given --split-index 3 must not
    quietly prepare split 0."""
    if args.split_index != 0 and fmt != "npz":
        raise UsageError(f"--split-index chooses among an npz's stored splits; --format {fmt} "
                         "has none to choose")
    if args.split is not None and fmt != "ogb":
        raise UsageError(f"--split names an OGB split directory; --format {fmt} has none")
    given = [name for name, v in (("--delimiter", args.delimiter), ("--header/--no-header",
             args.header), ("--one-based", args.one_based or None),
             ("--node-table", args.node_table)) if v is not None]
    if given and fmt != "edgelist":
        raise UsageError(f"{given[0]} goes with --format edgelist, not {fmt}")
    if args.node_table is None:
        for name, v in (("--id-column", args.id_column != "id" or None),
                        ("--label-column", args.label_column),
                        ("--feature-columns", args.feature_columns)):
            if v is not None:
                raise UsageError(f"{name} names a column of the --node-table; none is given")


def _source(args: argparse.Namespace, comm=None):  # noqa: ANN001, ANN202 - a GraphSource
    """The source of ``--format``; ``comm`` (a runtime.Comm) splits a SNAP counting pass."""

    fmt = args.format
    if fmt == "auto":
        if args.input is None:
            raise UsageError("--format auto needs --input PATH (or name a generator: "
                             "--format rmat|sbm)")
        fmt = detect_format(args.input)
    if fmt in SYNTHETIC:
        if args.input is not None:
            raise UsageError(f"--input is not used with --format {fmt}")
    elif args.input is None:
        raise UsageError(f"--format {fmt} needs --input PATH")
    for k in ("nodes", "edges", "classes", "features", "edge_features"):
        v = getattr(args, k)
        if v is not None and v < 1:
            raise UsageError(f"--{k.replace('_', '-')} {v}: must be positive")
    _check_format_options(args, fmt)
    if args.edge_features and fmt not in SYNTHETIC:
        raise UsageError(f"--edge-features generates edge features for the generators, not "
                         f"--format {fmt} (a source's own edge features are kept as they are)")
    if fmt not in SYNTHETIC and (args.edges is not None or
                                 (args.nodes and fmt not in ("snap", "edgelist"))):
        raise UsageError(f"--nodes/--edges do not apply to --format {fmt}")
    if fmt == "rmat":
        if args.nodes is None or args.edges is None:
            raise UsageError("--format rmat needs --nodes and --edges")
        src = RmatSource(args.nodes, args.edges, args.seed,
                         edge_features=args.edge_features or 0)
    elif fmt == "sbm":
        kw = {k: getattr(args, a) for k, a in (("num_nodes", "nodes"), ("num_edges", "edges"),
              ("num_classes", "classes"), ("num_features", "features"),
              ("edge_features", "edge_features")) if getattr(args, a)}
        return MemorySource(sbm(seed=args.seed, **kw))
    elif fmt == "ogb":
        src = open_ogb(args.input, args.split)
    elif fmt == "gnn-benchmark":
        files = sorted(args.input.glob("*.npz")) if args.input.is_dir() else [args.input]
        src = MemorySource(read_gnn_benchmark(args.input), files)
    elif fmt == "npz":
        src = MemorySource(read_edge_npz(args.input, args.split_index), [args.input])
    elif fmt == "edgelist":
        layout = detect_layout(args.input, args.delimiter, args.header, args.one_based)
        table = None
        if args.node_table is not None:
            table = NodeTable(args.node_table, args.id_column, args.label_column,
                              args.feature_columns, args.one_based)
        n = args.nodes if table is None else count_rows(table)
        src = EdgeListSource(args.input, layout, n, comm=comm, chunk_edges=args.chunk_edges,
                             count_degrees=args.permutation == "degree")
        if table is not None:
            src = NodeTableSource(src, table, n)
    elif fmt == "snap":
        src = SnapSource(args.input, args.nodes, comm=comm, chunk_edges=args.chunk_edges,
                         count_degrees=args.permutation == "degree")
    else:
        src = MtxSource(args.input)
    if args.features or args.classes:
        if args.features and src.num_features:
            raise UsageError(f"{src.name}: has features; --features only applies to "
                             "featureless inputs")
        if args.classes and src.labels() is not None:
            raise UsageError(f"{src.name}: has labels; --classes only applies to unlabelled "
                             "inputs")
        src = GeneratedFeatures(src, args.features or 0, args.classes or 0, args.seed)
    return src


def _desc(args: argparse.Namespace) -> dict:
    keys = ("format", "nodes", "edges", "classes", "features", "split", "edge_features",
            "delimiter", "header", "id_column", "label_column", "feature_columns")
    d = {k: getattr(args, k) for k in keys if getattr(args, k) is not None}
    if args.one_based:
        d["one_based"] = True
    if args.node_table is not None:
        d["node_table"] = str(Path(args.node_table).resolve())
    if args.input is not None:
        d["input"] = str(Path(args.input).resolve())
    return d


def run(args: argparse.Namespace) -> int:
    if args.overwrite and args.resume:
        raise UsageError("--overwrite and --resume exclude each other")
    if args.tiles is not None and args.tiles < 1:
        raise UsageError(f"--tiles {args.tiles}: must be positive")
    if args.chunk_edges < 1:
        raise UsageError("--chunk-edges must be positive")
    if args.balance_blocks is not None and args.permutation != "balanced":
        raise UsageError("--balance-blocks only applies to --permutation balanced")
    comm = world_comm()
    opts = PrepOptions(
        out=args.out, tiles=args.tiles, symmetrize=args.symmetrize,
        self_loops=not args.no_self_loops, features_dtype=args.features_dtype, seed=args.seed,
        sparse_features=args.sparse_features,
        permutation=args.permutation, balance_blocks=args.balance_blocks,
        overwrite=args.overwrite, resume=args.resume, chunk_edges=args.chunk_edges,
        progress=not args.quiet, source_desc=_desc(args),
    )
    src = _source(args, comm)
    m = prepare(src, opts, comm)
    if comm.rank == 0:
        print(summary_line(m, args.out), file=sys.stderr)
    return 0


def summary_line(m: dict, out: Path) -> str:
    """One line: N, E, F, C, tiles, tile imbalance (max/mean nnz), time, output."""
    return (f"prep: {m['name']}: N={m['N']} E={m['E']} F={m['F']} C={m['C']} "
            f"tiles={m['T']}x{m['T']} imbalance={m['tile_imbalance']:.3f} "
            f"time={m['prep_seconds']:.1f}s ranks={m['prep_ranks']} -> {out}")
