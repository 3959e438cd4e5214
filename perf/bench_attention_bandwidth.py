"""How close the fused attention kernel is to the memory limit: bytes per pass and GB/s.

    python -m perf.bench_attention_bandwidth [--device cuda] [--graphs uniform powerlaw]
                                             [--dtypes float32 bfloat16] [--reps 3]

For each graph (``uniform``: 1M nodes, 20M uniformly random edges; ``powerlaw``: 1M nodes,
20M edges whose ends follow a Zipf law, a few hubs of degree ~10^5 among them), dtype and
case — ``plain`` (the fused kernel), ``bias`` (with an [h, E] edge bias and its gradient),
``ring`` (the pattern in 4 column blocks, each block's forward merged by the log-sum-exp rule
and its backward from the whole rows' lse and delta, as GP-Ring runs them) — three passes are
timed (forward, row backward, column backward; the minimum of ``reps``) and each is given:

* ``bytes``: the bytes the pass must move at the least: every array it reads once (Q, K, V,
  dY, the CSR or CSC index, lse, delta, the bias) and every array it writes (Y, lse, dQ, dK,
  dV, the bias gradient). Gathers re-read K/V rows; that traffic is what the caches must
  absorb, and is reported as ``gather_bytes`` (E rows of h·d' per gathered tensor). A
  program holds a group of HG heads of node-major K/V (:func:`plexgt.ops.attention_triton.
  blocks`), so each edge is one gather of HG·d' contiguous elements and the index is read
  once per head group, not once per head: ``index_bytes`` is that index traffic of one pass
  (E·ceil(h / HG) indices; at 8 heads of 16 one group, the least; it was 8x);
* ``gbps``: bytes / time, and ``fraction``: that over the device-to-device copy bandwidth
  measured in the same run (a copy of ``--copy-mb`` MiB: read + write bytes / time).

One head layout as the models use: hidden 128 in 8 heads (d' = 16). Writes
perf/results/<--name>.json after every case (a run stopped at its time limit keeps what it
measured) and ends with one RESULT line. On a CPU the kernels run under Triton's interpreter
(only for the unit test's tiny sizes: the numbers mean nothing there).
"""

from __future__ import annotations

import argparse
import time

import torch

from perf.harness import hardware, result_line, today, write_json
from plexgt.ops import attention_triton as at
from plexgt.ops.csr import CSRGraph

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GRAPHS = {"uniform": (1_000_000, 20_000_000), "powerlaw": (1_000_000, 20_000_000)}
HEADS, HEAD_DIM, BLOCKS = 8, 16, 4


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, mib: int, reps: int = 5) -> float:
    """Bytes per second of a same-device copy (read + write counted), the best of ``reps``."""
    src = torch.empty(mib << 20, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(reps + 1):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * src.numel() / best


def make_graph(kind: str, n: int, e: int, device: torch.device, seed: int = 0) -> CSRGraph:
    """``uniform``: both ends uniform. ``powerlaw``: destinations and sources drawn from a
    Zipf law (exponent 1.1) over a random node order: a few rows and columns of very high
    degree (the hubs) and a long tail."""
    g = torch.Generator().manual_seed(seed)
    if kind == "uniform":
        dst, src = torch.randint(0, n, (e,), generator=g), torch.randint(0, n, (e,), generator=g)
    else:
        w = torch.arange(1, n + 1, dtype=torch.float64).pow_(-1.1)
        perm = torch.randperm(n, generator=g)
        dst = perm[torch.multinomial(w, e, replacement=True, generator=g)]
        src = perm[torch.multinomial(w, e, replacement=True, generator=g)]
    return CSRGraph.from_coo(dst.to(device), src.to(device), n, n)


def pass_bytes(graph: CSRGraph, h: int, d: int, esize: int, bias: bool) -> dict[str, int]:
    """The least bytes of each pass (the module docstring) for one block ``graph``."""
    nr, nc, e = graph.num_rows, graph.num_cols, graph.num_edges
    ib = 4 if graph._fits_int32() else 8
    rows, cols = nr * h * d * esize, nc * h * d * esize
    acc = nr * h * d * 4  # y kept in float32
    stat = nr * h * 4  # lse, delta
    index = (nr + 1 + e) * ib
    tindex = (nc + 1 + e) * ib + (e * ib if bias else 0)  # + the transpose permutation
    b = e * h * esize if bias else 0
    groups = -(-h // at.blocks(nr, e, d, h).heads)
    return {"forward": rows + 2 * cols + index + b + acc + stat,
            "backward_rows": 2 * rows + 2 * cols + 2 * stat + index + 2 * b + rows,
            "backward_cols": 2 * rows + 2 * cols + 2 * stat + tindex + b + 2 * cols,
            "gather_bytes": 2 * e * h * d * esize, "index_bytes": groups * e * ib}


def column_blocks(graph: CSRGraph, blocks: int) -> list[tuple[int, CSRGraph]]:
    """(first column, block pattern) of ``blocks`` column ranges, as a ring's steps see K/V."""
    row = graph.row
    step = -(-graph.num_cols // blocks)
    out = []
    for c0 in range(0, graph.num_cols, step):
        c1 = min(graph.num_cols, c0 + step)
        keep = (graph.indices >= c0) & (graph.indices < c1)
        out.append((c0, CSRGraph.from_coo(row[keep], graph.indices[keep] - c0,
                                          graph.num_rows, c1 - c0)))
    return out


def run_case(graph: CSRGraph, case: str, dtype: torch.dtype, reps: int) -> dict[str, dict]:
    """Time the three passes of one case (min of ``reps`` after a warm-up)."""
    dev = graph.device
    g = torch.Generator(device=dev).manual_seed(1)
    n = graph.num_rows

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dtype)

    q, k, v, dy = rnd(n, HEADS, HEAD_DIM), rnd(n, HEADS, HEAD_DIM), rnd(n, HEADS, HEAD_DIM), \
        rnd(n, HEADS, HEAD_DIM)
    scale = HEAD_DIM ** -0.5
    blocks = column_blocks(graph, BLOCKS) if case == "ring" else [(0, graph)]
    bias = {c0: rnd(b.num_edges, HEADS).t() if case == "bias" else None for c0, b in blocks}
    for _, b in blocks:  # the patterns' caches (transpose, int32 copies) outside the timing
        b.transpose()
        b.compact_index(), b.transpose().compact_index(), b.compact_transpose_perm()
    state: dict = {}

    def forward():
        ys, lses = [], []
        for c0, b in blocks:
            w = b.num_cols
            y, lse = at.fused_forward(b, q, k[c0:c0 + w], v[c0:c0 + w], scale, None, bias[c0])
            ys.append(y)
            lses.append(lse)
        lse = torch.logsumexp(torch.stack(lses), 0) if len(lses) > 1 else lses[0]
        wts = [torch.exp(x - lse).nan_to_num_(0.0).t()[:, :, None] for x in lses]
        state["y"] = sum(w * y for w, y in zip(wts, ys)) if len(ys) > 1 else ys[0]
        state["lse"] = lse

    def backward(rows: bool, cols: bool):
        delta = at.row_delta(state["y"], dy)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for c0, b in blocks:
            w = b.num_cols
            at.fused_backward(b, q, k[c0:c0 + w], v[c0:c0 + w], state["lse"], delta, dy,
                              scale, (rows, cols, cols), bias[c0], rows and case == "bias",
                              (dk[c0:c0 + w], dv[c0:c0 + w]) if cols else None)

    passes = {"forward": forward, "backward_rows": lambda: backward(True, False),
              "backward_cols": lambda: backward(False, True)}
    esize = torch.empty((), dtype=dtype).element_size()
    need = {p: 0 for p in (*passes, "gather_bytes", "index_bytes")}
    for _, b in blocks:
        for key, val in pass_bytes(b, HEADS, HEAD_DIM, esize, case == "bias").items():
            need[key] += val
    out = {}
    for name, fn in passes.items():
        best = float("inf")
        for _ in range(reps + 1):
            _sync(dev)
            t = time.perf_counter()
            fn()
            _sync(dev)
            best = min(best, time.perf_counter() - t)
        out[name] = {"min_s": best, "bytes": need[name]}
    out["gather_bytes"], out["index_bytes"] = need["gather_bytes"], need["index_bytes"]
    return out


def measure(device: torch.device, graphs: dict[str, tuple[int, int]], dtypes: list[str],
            reps: int, copy_mib: int, name: str | None) -> dict:
    """Every (graph, dtype, case): the passes' times, bytes, GB/s and fraction of the copy
    bandwidth measured first; written to ``name`` after each case when given."""
    copy_bw = copy_bandwidth(device, copy_mib)
    res: dict = {"date": today(), "hardware": hardware(device.type), "device": str(device),
                 "heads": HEADS, "head_dim": HEAD_DIM, "copy_gbps": copy_bw / 1e9,
                 "copy_mib": copy_mib, "cases": {}}
    for gname, (n, e) in graphs.items():
        graph = make_graph(gname, n, e, device)
        deg = graph.degrees()
        res.setdefault("graphs", {})[gname] = {"nodes": n, "edges": graph.num_edges,
                                               "max_degree": int(deg.max()),
                                               "mean_degree": graph.num_edges / n}
        for dt in dtypes:
            for case in ("plain", "bias", "ring"):
                key = f"{gname}/{dt}/{case}"
                try:
                    r = run_case(graph, case, DTYPES[dt], reps)
                except Exception as exc:  # noqa: BLE001 - recorded, the next case still runs
                    res["cases"][key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                    continue
                for p in ("forward", "backward_rows", "backward_cols"):
                    r[p]["gbps"] = r[p]["bytes"] / r[p]["min_s"] / 1e9
                    r[p]["fraction"] = r[p]["gbps"] / res["copy_gbps"]
                res["cases"][key] = r
                if name:
                    write_json(name, res)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=list(GRAPHS))
    ap.add_argument("--nodes", type=int, default=None, help="override every graph's size")
    ap.add_argument("--edges", type=int, default=None)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--copy-mb", type=int, default=1024)
    ap.add_argument("--name", default="bench_attention_bandwidth.json")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    graphs = {gn: (args.nodes or GRAPHS[gn][0], args.edges or GRAPHS[gn][1])
              for gn in args.graphs}
    res = measure(device, graphs, args.dtypes, args.reps, args.copy_mb, args.name)
    fr = [c[p]["fraction"] for c in res["cases"].values() if "error" not in c
          for p in ("forward", "backward_rows", "backward_cols")]
    result_line(bench="attention_bandwidth", device=str(device), copy_gbps=res["copy_gbps"],
                cases=len(res["cases"]),
                errors=sum("error" in c for c in res["cases"].values()),
                best_fraction=max(fr) if fr else 0.0, worst_fraction=min(fr) if fr else 0.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
