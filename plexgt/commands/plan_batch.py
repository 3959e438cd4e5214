"""``plexgt plan`` for node-sequence models (layout 'batch'): the (dp, pp, cp, K, partition)
search's view.

Kept beside :mod:`plexgt.commands.plan` rather than in it: the full-graph models' views are
tables of grids and strategies per scale; these are meshes and layer partitions on exactly
the job's ranks, with the time-memory frontier (MegaGraph's Pareto view), which a user reads
to trade a pipeline's bubbles against context parallelism's ring.
"""

from __future__ import annotations

import argparse
from typing import Any

from plexgt.config import TrainConfig
from plexgt.plan.agp import SystemModel
from plexgt.plan.batch_search import BatchCandidate, BatchSearch
from plexgt.plan.choose import Choice, GraphSizes, ModelShape, NothingFits, RunPlan, choose


def candidate_fields(c: BatchCandidate) -> dict[str, Any]:
    """One priced mesh and partition: what it is and its prediction."""
    return {"label": c.label, "dp": c.dp, "pp": c.pp, "cp": c.cp,
            "micro_batches": c.micro_batches, "stages": list(c.stages), "time_s": c.step_s,
            "memory_bytes": c.peak_bytes, "stage_bytes": list(c.stage_bytes)}


def plan_fields(rp: RunPlan) -> dict[str, Any]:
    """The chosen layout, as the JSON's ``choice``."""
    dp, pp, cp = rp.mesh or (1, 1, 1)
    return {"label": rp.label, "scale": rp.scale, "dp": dp, "pp": pp, "cp": cp,
            "micro_batches": rp.micro_batches, "stages": list(rp.stages),
            "time_s": rp.time_s, "memory_bytes": rp.memory_bytes,
            "split": [{"what": w, "seconds": t} for w, t in rp.split]}


def train_flags(rp: RunPlan) -> list[str]:
    """The ``plexgt train`` flags that run the chosen layout without searching again."""
    dp, pp, cp = rp.mesh or (1, 1, 1)
    return [f"--parallel.dp={dp}", f"--parallel.pp={pp}", f"--parallel.cp={cp}",
            f"--parallel.stages={','.join(map(str, rp.stages))}",
            f"--parallel.micro_batches={rp.micro_batches}"]


def search_view(args: argparse.Namespace, cfg: TrainConfig, sizes: GraphSizes,
                shape: ModelShape, sysm: SystemModel, limit: int | None,
                batch_table: dict[str, Any] | None = None) -> dict[str, Any]:
    """The search on exactly ``--world-size`` ranks (what ``plexgt train`` on that many
    runs), printed: its frontier, the choice and where its step's time goes; returned for
    the JSON."""
    P = args.world_size
    out: dict[str, Any] = {"search": {}, "choice": None, "rows": []}
    b = cfg.batch
    print(f"node sequences: {b.sequences} a step of {b.size} nodes ({b.targets} targets, "
          f"{b.global_nodes} global nodes), {b.context} context")
    try:
        ch: Choice = choose(sizes, shape, P, sysm, None, limit,  # type: ignore[arg-type]
                            batch_table=batch_table)
    except NothingFits as e:
        out["search"]["at_world_size"] = None
        out["search"]["least_memory_bytes"] = (None if e.least_memory is None
                                               else e.least_memory[0])
        print(str(e))
        return out
    rp, found = ch
    assert isinstance(found, BatchSearch)
    print(f"search on {P} ranks: {found.meshes} (dp, pp, cp, micro-batches) meshes, "
          f"{found.programmes} partition programmes (every partition of the "
          f"{shape.layers} layers covered), in {found.seconds:.2f} s")
    print(f"{'configuration':<36} {'step s':>10} {'GiB/rank':>9}  (the time-memory frontier)")
    for c in found.frontier:
        chosen = c.label == rp.label
        print(f"{c.label:<36} {c.step_s:>10.4g} {c.peak_bytes / 2**30:>9.3g}"
              + ("  <- fastest" if chosen else ""))
    out["rows"] = [candidate_fields(c) for c in found.candidates]
    out["search"].update(frontier=[candidate_fields(c) for c in found.frontier],
                         meshes=found.meshes, seconds=found.seconds,
                         least_memory_bytes=found.least_memory)
    out["search"]["at_world_size"] = out["choice"] = plan_fields(rp)
    print(f"choice on {P} ranks (what train with the layout keys 'auto' runs): {rp.label}, "
          f"{rp.time_s:.4g} s a step, {rp.memory_bytes / 2**30:.3g} GiB per rank")
    print("where the step's predicted time goes:")
    for what, t in rp.split:
        print(f"  {t:>10.4g} s  {what}")
    data = f"--data {args.data}" if args.data is not None else "--data PREPARED"
    conf = f" --config {args.config}" if args.config else ""
    print(f"next: mpiexec -n {P} plexgt train {data} --model {cfg.model.name}{conf} "
          + " ".join(train_flags(rp)))
    return out
