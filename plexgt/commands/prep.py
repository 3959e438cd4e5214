"""``plexgt prep``: shard a dataset once into a prepared directory (see plexgt/data/shard.py).

Runs as one process or under ``mpiexec`` (ranks share the work; the output is identical).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plexgt.data.formats import options as source_options
from plexgt.data.formats.registry import default_registry
from plexgt.data.formats.spec import FormatRegistry
from plexgt.data.shard import PrepOptions, prepare
from plexgt.data.source import FEATURE_NORMALIZATIONS
from plexgt.distributed.hostcomm import world_comm
from plexgt.errors import UsageError

HELP = "Shard a dataset into adjacency tiles, features and node arrays (out of core, MPI)."
STARTS_MPI = True
"""It runs in MPI's world: the CLI starts MPI (mpi4py) before importing this module, as for
every MPI command (plexgt.cli.main)."""


def add_arguments(p: argparse.ArgumentParser, formats: FormatRegistry | None = None) -> None:
    """prep's options; ``--format``, ``--input`` and each format's own come from ``formats``
    (default: the built-in registry)."""
    formats = default_registry() if formats is None else formats
    source_options.add_arguments(p, formats)
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--tiles", type=int, help="tiles per side T (default: ~8M nonzeros a tile)")
    sym = p.add_mutually_exclusive_group()
    sym.add_argument("--symmetrize", nargs="?", choices=("auto", "yes", "no"), const="yes",
                     default="auto",
                     help="add every reverse edge: auto (default) = when fewer than 1%% of the "
                     "edges have their reverse (an undirected graph listed once; the summary "
                     "line says which); --symmetrize (yes) always; no = keep the graph directed")
    sym.add_argument("--no-symmetrize", dest="symmetrize", action="store_const", const="no",
                     help="keep the graph directed (= --symmetrize no)")
    p.add_argument("--no-self-loops", action="store_true", help="do not add self loops")
    p.add_argument("--sparse-features", choices=("auto", "yes", "no"), default="auto",
                   help="store features as CSR tiles that train sparse (X·W as SpMM): auto = "
                   "when their density (nonzeros / N·F, as the source declares it or prep "
                   "measures it) is below 10%% (bag-of-words)")
    p.add_argument("--features-dtype", choices=("float16", "float32"),
                   help="stored feature dtype (default: float16 sources stay float16, "
                   "others float32)")
    p.add_argument("--normalize-features", choices=FEATURE_NORMALIZATIONS, default="none",
                   help="row: divide every node's feature row by its sum (PyG's "
                   "NormalizeFeatures, which the published Amazon/Coauthor recipes use; rows "
                   "summing to 0 kept), dense and sparse tiles alike, recorded in the "
                   "manifest; none (default): as the source has them")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the permutations, the generators and the split: a source "
                   "with no train/valid/test split of its own (e.g. an edge list without "
                   "--split-column) gets a random 60/20/20 one, recorded in the manifest")
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
    p.add_argument("--chunk-edges", type=int, default=1 << 21,
                   help="edges per streamed chunk: bounds prep's streaming memory (text parse "
                   "blocks of ~16 bytes an edge, bucket buffers of 4 chunks)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(args: argparse.Namespace, formats: FormatRegistry | None = None) -> int:
    """Prepare the source ``args`` name; ``formats`` must be the registry ``args`` were parsed
    with (default: the built-in one)."""
    formats = default_registry() if formats is None else formats
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
        progress=not args.quiet, source_desc=source_options.describe(args, formats),
        normalize_features=args.normalize_features,
    )
    src = source_options.open_source(args, formats, comm)
    m = prepare(src, opts, comm)
    if comm.rank == 0:
        print(summary_line(m, args.out), file=sys.stderr)
    return 0


def summary_line(m: dict, out: Path) -> str:
    """One line: N, E, F, C, whether (and why) symmetrized, the features' layout and density,
    tiles, tile imbalance (max/mean nnz), time, output."""
    return (f"prep: {m['name']}: N={m['N']} E={m['E']} F={m['F']} C={m['C']} "
            f"{symmetry_note(m)}{feature_note(m)} tiles={m['T']}x{m['T']} "
            f"imbalance={m['tile_imbalance']:.3f} time={m['prep_seconds']:.1f}s "
            f"ranks={m['prep_ranks']} -> {out}")


def feature_note(m: dict) -> str:
    """`` features=csr (0.3% nonzero)`` (empty without features)."""
    if not m.get("F"):
        return ""
    d = m.get("feature_density")
    return f" features={m.get('feature_layout', 'dense')}" + (
        "" if d is None else f" ({100 * d:.3g}% nonzero)")


def symmetry_note(m: dict) -> str:
    """``symmetrized=yes|no`` with the measured share of edges that have their reverse, and
    when ``auto`` decided, that it did (``symmetrized=yes (auto: 0.0% of edges have their
    reverse)``)."""
    r = m.get("reciprocity", {})
    sym = "yes" if m.get("symmetrized") else "no"
    if "fraction" not in r:
        return f"symmetrized={sym}"
    share = f"{100 * r['fraction']:.1f}%{'' if r.get('exact', True) else ' (sampled)'}"
    auto = "auto: " if r.get("asked") == "auto" else ""
    return f"symmetrized={sym} ({auto}{share} of edges have their reverse)"
