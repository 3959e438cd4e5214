"""Machine descriptions: what a planner knows about a machine it has not run on.

A description is a TOML file (``plexgt/plan/machines/perlmutter.toml``, ``frontier.toml``,
``dgx-a100.toml``, or a user's), one documented number per line, each with its source beside
it. :meth:`Machine.profile` turns it into the system-profile form ``plexgt profile`` writes, so
AGP (:class:`~plexgt.plan.agp.SystemModel`) and the 3D model
(:class:`~plexgt.plan.plexus_cost.Coefficients`) price it unchanged, and a measured profile
replaces it field for field.

Why derived coefficients and not a measurement: the planner must answer "how many GPUs, which
layout" before the first allocation on the machine. The kernel terms come from a published
per-kernel measurement (SpMM and SDDMM seconds per edge and column) and from bandwidth and
peak-rate specifications; collectives from where a group's ranks sit (:mod:`plexgt.plan.
placement`): its size and stride decide how many nodes it spans and how many of a node's
groups share its NICs, and a description's ``[[placement]]`` rules give the measured bandwidth
by size and stride where it is published (each with its source).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plexgt.config import GPU_MEMORY_FRACTION, GPU_MEMORY_RESERVE_GIB
from plexgt.plan.placement import Link, Rule, Topology

MACHINES_DIR = Path(__file__).resolve().parent / "machines"
OPS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")
"""The collectives the ledgers record (and the cost models price)."""


def usable_memory(total_bytes: int, fraction: float = GPU_MEMORY_FRACTION,
                  reserve_gib: float = GPU_MEMORY_RESERVE_GIB) -> int:
    """Bytes of a GPU of ``total_bytes`` that a plan may fill: ``fraction`` of it less
    ``reserve_gib`` (:data:`GPU_MEMORY_FRACTION`, :data:`GPU_MEMORY_RESERVE_GIB`), never
    below 0."""
    return max(0, int(fraction * total_bytes - reserve_gib * 2**30))


RUNTIMES = ("cuda", "rocm")
"""The GPU builds of torch a description may name (``runtime``; default 'cuda')."""


class MachineError(ValueError):
    """A machine description that cannot be used (names the file and the field)."""


@dataclass(frozen=True)
class Machine:
    """A machine description (see the module doc and the shipped TOML files)."""

    name: str
    description: str
    device: str
    gpus_per_node: int
    """GPUs (ranks) a node holds."""
    memory_per_gpu_bytes: int
    hbm_bytes_per_s: float
    fp32_flops: float
    """Peak FP32 rate (multiply-adds count two)."""
    spmm_s_per_edge_col: float
    """Seconds per (edge x dense column) of an SpMM pass."""
    sddmm_s_per_edge_col: float
    """Seconds per (edge x dense column) of an SDDMM pass."""
    intra: Link
    """Between GPUs of one node."""
    inter: Link
    """Between GPUs of different nodes."""
    path: str = ""
    nics_per_node: int = 0
    """Network interfaces a node has (0: one a GPU)."""
    nic_bytes_per_s: float = 0.0
    """Bytes one NIC sends a second (0: the inter-node link's)."""
    rules: tuple[Rule, ...] = ()
    """Measured bandwidth by group size and stride (``[[placement]]``)."""

    @property
    def topology(self) -> Topology:
        """Nodes and links as a collective's placement sees them."""
        return Topology(self.gpus_per_node, self.nics_per_node or self.gpus_per_node,
                        self.nic_bytes_per_s or self.inter.bytes_per_s, self.intra,
                        self.inter, self.rules)
    runtime: str = "cuda"
    """'cuda' or 'rocm': the torch build its GPUs run (a ROCm GPU has no
    ``torch.sparse.sampled_addmm``, so plans there never choose the strategies needing it)."""
    memory_fraction: float = GPU_MEMORY_FRACTION
    """Share of a GPU's memory plans fill (``node.memory_fraction``, :func:`usable_memory`)."""
    memory_reserve_gib: float = GPU_MEMORY_RESERVE_GIB
    """GiB of a GPU taken first (``node.memory_reserve_gib``: context, NCCL)."""

    @property
    def usable_memory_bytes(self) -> int:
        """What a plan may fill of one GPU (:func:`usable_memory`)."""
        return usable_memory(self.memory_per_gpu_bytes, self.memory_fraction,
                             self.memory_reserve_gib)

    def link(self, group_size: int) -> Link:
        """The link a group of contiguous ranks of this size crosses."""
        return self.intra if group_size <= self.gpus_per_node else self.inter

    def kernel_fits(self) -> dict[str, float]:
        """AGP's kernel coefficients: the attention's six per-edge passes (forward SDDMM and
        SpMM; backward one SDDMM and three SpMM) from the measured kernels, its [h, E] softmax
        passes (6 float32 reads and writes) and [n, h, d'] row passes (4) from the bandwidth,
        what recomputing the scores adds likewise, GEMMs from the peak rate."""
        bw = self.hbm_bytes_per_s
        return {
            "spmm_s_per_nnz_col": self.spmm_s_per_edge_col,
            "sddmm_s_per_nnz_col": self.sddmm_s_per_edge_col,
            "attention_s_per_edge_head_dim": 2 * self.sddmm_s_per_edge_col
            + 4 * self.spmm_s_per_edge_col,
            "attention_s_per_edge_head": 6 * 8 / bw,
            "attention_s_per_row_head_dim": 4 * 8 / bw,
            "attention_s_per_col_head_dim": 4 * 8 / bw,
            # scores rebuilt in backward: one more SDDMM, the exponentials and the rescale
            # (3 [h, E] float32 passes), the block's Q and dY rows gathered (2 row passes)
            "recompute_s_per_edge_head_dim": self.sddmm_s_per_edge_col,
            "recompute_s_per_edge_head": 3 * 8 / bw,
            "recompute_s_per_row_head_dim": 2 * 8 / bw,
            "elementwise_s_per_elem": 8 / bw,
            "copy_s_per_elem": 8 / bw,
            "gemm_s_per_fma": 2 / self.fp32_flops,
            "attention_s_per_head": 0.0,
            "dense_s_per_row_d2": 0.0, "dense_s_per_row_d": 0.0, "dense_s_per_block": 0.0,
        }

    def collective_fits(self, max_ranks: int) -> dict[str, dict[str, dict[str, float]]]:
        """op -> group size -> (latency of its ring, seconds per byte a rank sends), at powers
        of two up to ``max_ranks`` and at a node's size (planners interpolate between)."""
        sizes = sorted({2 ** k for k in range(1, max(1, max_ranks - 1).bit_length() + 1)}
                       | {self.gpus_per_node, self.gpus_per_node + 1})
        out: dict[str, dict[str, dict[str, float]]] = {}
        topo = self.topology
        for op in OPS:
            out[op] = {}
            for s in sizes:
                if s < 2:
                    continue
                lat, spb = topo.call(op, s, 1)  # contiguous ranks, as a job's groups of s
                out[op][str(s)] = {"latency_s": lat, "s_per_byte": spb}
        return out

    def profile(self, max_ranks: int) -> dict[str, Any]:
        """The description as a system profile (``plexgt profile``'s JSON form) for runs of up
        to ``max_ranks`` ranks. The 3D model has one link: the node's when the run fits in a
        node, else the network's."""
        k = self.kernel_fits()
        ln = self.link(max_ranks)
        return {
            "kind": "machine-description", "machine": self.name, "source": self.path,
            "hardware": {"device": self.device, "gpu": self.description, "cores": 1,
                         "rocm": self.runtime == "rocm"},
            "software": {"threads_per_rank": 1},
            "kernel_fits": k,
            "collective_fits": self.collective_fits(max_ranks),
            "plexus": {"spmm_s_per_nnz_col": k["spmm_s_per_nnz_col"],
                       "gemm_s_per_fma": k["gemm_s_per_fma"],
                       "latency_s": ln.latency_s, "s_per_byte": 1.0 / ln.bytes_per_s},
            "placement": self.topology.to_dict(),
        }


def merge_profile(base: dict[str, Any], measured: dict[str, Any] | None) -> dict[str, Any]:
    """``base`` (a description's profile) with every field a measured profile has replaced
    by the measurement, at any depth (a kernel fit, one collective at one group size)."""
    if not measured:
        return base
    out = dict(base)
    for k, v in measured.items():
        out[k] = merge_profile(out[k], v) if isinstance(v, dict) and isinstance(
            out.get(k), dict) else v
    return out


def machine_names() -> list[str]:
    """The shipped descriptions."""
    return sorted(p.stem for p in MACHINES_DIR.glob("*.toml"))


def load_machine(spec: str | Path) -> Machine:
    """A shipped description by name (``perlmutter``, ``frontier``, ``dgx-a100``) or a TOML
    file's; :class:`MachineError` names the file and the field for anything missing or
    impossible."""
    path = Path(spec)
    if not path.suffix and str(spec) in machine_names():
        path = MACHINES_DIR / f"{spec}.toml"
    if not path.is_file():
        raise MachineError(f"machine {spec!r}: no such description (shipped: "
                           f"{', '.join(machine_names())}; or a path to a .toml file)")
    try:
        raw = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise MachineError(f"{path}: not valid TOML ({e})") from None

    def num(section: str, key: str, integer: bool = False) -> float:
        where = f"{section}.{key}" if section else key
        node: Any = raw
        for part in where.split("."):
            if not isinstance(node, dict) or part not in node:
                raise MachineError(f"{path}: missing {where}")
            node = node[part]
        if isinstance(node, bool) or not isinstance(node, (int, float)) or not node > 0 \
                or (integer and not isinstance(node, int)):
            raise MachineError(f"{path}: {where} = {node!r} must be a positive "
                               f"{'integer' if integer else 'number'}")
        if not math.isfinite(node):  # TOML reads inf, and 1e400 as inf
            raise MachineError(f"{path}: {where} = {node!r} must be finite")
        return node

    def link(which: str) -> Link:
        return Link(num(f"links.{which}", "gb_per_s") * 1e9,
                    num(f"links.{which}", "latency_us") * 1e-6)

    def opt(section: str, key: str, integer: bool = False) -> float:
        return num(section, key, integer) if key in (raw.get(section) or {}) else 0

    def rule(i: int, r: Any) -> Rule:
        where = f"placement.rules[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("source"), str) or not r["source"]:
            raise MachineError(f"{path}: {where} needs a source (where its number comes from)")
        vals = {}
        for key in ("stride_min", "stride_max", "size_min", "size_max", "gb_per_s"):
            v = r.get(key)
            if v is None and key in ("stride_max", "size_max"):
                vals[key] = None
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                    or not math.isfinite(v) or (key != "gb_per_s" and not isinstance(v, int)):
                raise MachineError(f"{path}: {where}.{key} = {v!r} must be a positive "
                                   f"{'number' if key == 'gb_per_s' else 'integer'}")
            vals[key] = v
        return Rule(vals["stride_min"], vals["stride_max"], vals["size_min"],
                    vals["size_max"], vals["gb_per_s"] * 1e9, r["source"])

    def optional(section: str, key: str, default: float, low: float, high: float) -> float:
        node = raw.get(section, {})
        v = node.get(key, default) if isinstance(node, dict) else default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not low <= v <= high \
                or not math.isfinite(v):
            raise MachineError(f"{path}: {section}.{key} = {v!r} must be a number in "
                               f"[{low}, {high}]")
        return float(v)

    fraction = optional("node", "memory_fraction", GPU_MEMORY_FRACTION, 0.01, 1.0)
    reserve = optional("node", "memory_reserve_gib", GPU_MEMORY_RESERVE_GIB, 0.0, math.inf)
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise MachineError(f"{path}: missing name")
    runtime = raw.get("runtime", "cuda")
    if runtime not in RUNTIMES:
        raise MachineError(f"{path}: runtime = {runtime!r} must be one of "
                           f"{', '.join(RUNTIMES)}")
    rules = (raw.get("placement") or {}).get("rules", []) if isinstance(
        raw.get("placement", {}), dict) else None
    if not isinstance(rules, list):
        raise MachineError(f"{path}: placement.rules must be a list of tables")
    return Machine(
        name=name, description=str(raw.get("description", name)),
        device=str(raw.get("device", "cuda")),
        gpus_per_node=int(num("node", "gpus", integer=True)),
        memory_per_gpu_bytes=int(num("node", "memory_per_gpu_gib") * 2**30),
        hbm_bytes_per_s=num("gpu", "hbm_gb_per_s") * 1e9,
        fp32_flops=num("gpu", "fp32_tflops") * 1e12,
        spmm_s_per_edge_col=num("kernels", "spmm_s_per_edge_col"),
        sddmm_s_per_edge_col=num("kernels", "sddmm_s_per_edge_col"),
        intra=link("intra"), inter=link("inter"), path=str(path),
        nics_per_node=int(opt("node", "nics", integer=True)),
        nic_bytes_per_s=opt("node", "nic_gb_per_s") * 1e9,
        rules=tuple(rule(i, r) for i, r in enumerate(rules)),
        runtime=runtime,
        memory_fraction=fraction, memory_reserve_gib=reserve,
    )
