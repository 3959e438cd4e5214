"""What grid-invariant (counter-based) dropout costs against stream dropout (``torch.rand``).

* masks: inverted dropout of an [n, d] activation, counter-based (:mod:`plexgt.ops.rng`) vs a
  ``torch.rand(...) >= p`` mask (what plexgt drew before; not grid-invariant), per element.
* step: a single-process graph-transformer training step (forward, backward, AdamW) on an SBM
  graph with dropout 0.5 everywhere, counter-based vs stream masks vs dropout off; the same
  model and data, the variants interleaved step by step, medians reported.

Writes perf/results/bench_dropout.json and ends with one RESULT line.
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch
import torch.nn.functional as F

from perf.harness import hardware, result_line, today, write_json
from plexgt.data.synthetic import sbm
from plexgt.models.gt import GraphTransformer
from plexgt.models.layers import ModelGraph
from plexgt.ops.rng import CounterRNG


def stream_dropout(self: CounterRNG, x: torch.Tensor, p: float, site: int, col0: int = 0
                   ) -> torch.Tensor:
    """The baseline: a mask from torch's generator (depends on what the rank drew before)."""
    if p <= 0.0:
        return x
    return x * (torch.rand_like(x) >= p).to(x.dtype).mul_(1.0 / (1.0 - p))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def mask_cost(n: int, d: int, repeats: int, device: torch.device) -> dict[str, float]:
    x = torch.randn(n, d, device=device)
    rng = CounterRNG(0, 0, torch.arange(n, device=device))
    fns = {"counter": lambda: rng.dropout(x, 0.5, site=1),
           "stream": lambda: stream_dropout(rng, x, 0.5, 1)}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    out = {f"{k}_ns_per_element": statistics.median(v) / (n * d) * 1e9 for k, v in times.items()}
    out["ratio"] = out["counter_ns_per_element"] / out["stream_ns_per_element"]
    return out


def step_cost(nodes: int, edges: int, hidden: int, steps: int, device: torch.device
              ) -> dict[str, float]:
    g = sbm(num_nodes=nodes, num_edges=edges, num_classes=8, num_features=128, seed=0)
    graph = ModelGraph.from_edges(g.dst, g.src, nodes, gcn=False, device=device)
    x = torch.from_numpy(g.features).float().to(device)
    y = torch.from_numpy(g.labels).long().to(device)
    models = {}
    for name, p in (("counter", 0.5), ("stream", 0.5), ("off", 0.0)):
        torch.manual_seed(0)
        m = GraphTransformer(128, hidden, 8, num_layers=2, heads=4, dropout=p).to(device)
        models[name] = (m, torch.optim.AdamW(m.parameters(), lr=1e-3))

    def one(name: str) -> float:
        m, opt = models[name]
        sync(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(m(x, graph), y).backward()
        opt.step()
        sync(device)
        return time.perf_counter() - t0

    times: dict[str, list[float]] = {k: [] for k in models}
    for i in range(steps + 2):
        for name in models:
            if name == "stream":
                with mock.patch.object(CounterRNG, "dropout", stream_dropout):
                    t = one(name)
            else:
                t = one(name)
            if i >= 2:  # warm-up
                times[name].append(t)
    out = {f"{k}_step_s": statistics.median(v) for k, v in times.items()}
    out["counter_vs_stream"] = out["counter_step_s"] / out["stream_step_s"]
    out["dropout_share_counter"] = 1 - out["off_step_s"] / out["counter_step_s"]
    out["dropout_share_stream"] = 1 - out["off_step_s"] / out["stream_step_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--nodes", type=int, default=20_000)
    ap.add_argument("--edges", type=int, default=200_000)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--out", default="bench_dropout.json")
    args = ap.parse_args()
    device = torch.device(args.device)
    masks = mask_cost(args.rows, args.dim, 9, device)
    step = step_cost(args.nodes, args.edges, args.hidden, args.steps, device)
    write_json(args.out, {"bench": "dropout", "date": today(), "hardware": hardware(args.device),
                          "device": args.device, "args": vars(args), "masks": masks,
                          "step": step})
    result_line(bench="dropout", device=args.device,
                mask_counter_vs_stream=round(masks["ratio"], 3),
                step_counter_vs_stream=round(step["counter_vs_stream"], 3),
                dropout_share_of_step_counter=round(step["dropout_share_counter"], 3),
                dropout_share_of_step_stream=round(step["dropout_share_stream"], 3))


if __name__ == "__main__":
    main()
