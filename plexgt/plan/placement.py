"""Where a collective's ranks sit, and what that costs: group size and stride -> node placement,
bandwidth and latency.

Why: a 3D grid has one contiguous axis. With 4 GPUs a node and the default order (Y
innermost), a Y group of 4 is one NVLink island, while an X group of a 16x4x4 grid has stride
4: every member on another node, its traffic through that node's NICs, which the node's other
X groups use at the same moment. Measured NCCL bandwidth differs by an order of magnitude
between the two (the Plexus authors' performance model: about 225 GB/s for 4 contiguous A100s
on Perlmutter, 16.6 GB/s strided), so a planner that prices by group size alone picks grids
and axis orders it should not.

The model, per collective over ``size`` ranks ``stride`` apart (``rank = first + k·stride``),
on nodes of ``gpus`` GPUs placed by consecutive rank:

* members per node m = min(size, gpus // stride) (1 once stride >= gpus); nodes spanned
  ceil(size / m);
* bandwidth per rank: a measured rule of the machine description for that (stride, size)
  when one matches (each with its source); else derived: inside one node the intra-node
  link; across nodes the node's NIC bandwidth shared by the streams leaving it at once (every
  group of the axis on the node communicates together: gpus / m of them, one stream each),
  and no more than the intra-node link when several members share a node (NCCL's rings pass
  through the node's GPUs first);
* latency: ring steps x the link latency (the inter-node one once the ring crosses nodes);
  an all-reduce across nodes takes the cheaper of the ring and NCCL's tree (2·ceil(log2
  nodes) inter-node hops plus the intra-node reduction), as NCCL switches to trees for small
  messages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

RING_STEPS = {"all_gather": 1, "reduce_scatter": 1, "all_reduce": 2, "all_to_all": 1,
              "send_recv": 0}
"""Latencies per (group size - 1) of each collective's ring algorithm (send_recv: one)."""


@dataclass(frozen=True)
class Link:
    """One kind of connection between two GPUs."""

    bytes_per_s: float
    """Bytes a GPU sends per second over it, each way."""
    latency_s: float
    """Seconds per message step."""


@dataclass(frozen=True)
class Rule:
    """A measured bandwidth per rank for groups of sizes [size_min, size_max] whose members
    are [stride_min, stride_max] ranks apart (None: no upper bound)."""

    stride_min: int
    stride_max: int | None
    size_min: int
    size_max: int | None
    bytes_per_s: float
    source: str = ""

    def matches(self, size: int, stride: int) -> bool:
        return (self.stride_min <= stride and (self.stride_max is None or stride <=
                                               self.stride_max)
                and self.size_min <= size and (self.size_max is None or size <= self.size_max))


@dataclass(frozen=True)
class GroupPlacement:
    """Where one group of a collective sits."""

    size: int
    stride: int
    per_node: int
    """Members on each node it touches."""
    nodes: int
    """Nodes it spans."""
    bytes_per_s: float
    """Bandwidth per rank of its collectives."""
    source: str
    """Where that number comes from (a rule's source, or 'derived: ...')."""

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1

    def describe(self) -> str:
        where = (f"across {self.nodes} nodes, {self.per_node} a node" if self.crosses_nodes
                 else "inside a node")
        return (f"{self.size} ranks stride {self.stride} ({where}): "
                f"{self.bytes_per_s / 1e9:.3g} GB/s")


@dataclass(frozen=True)
class Topology:
    """A machine's nodes and links as a collective sees them (module docstring)."""

    gpus_per_node: int
    nics_per_node: int
    nic_bytes_per_s: float
    """Bytes per second one NIC sends, each way."""
    intra: Link
    inter: Link
    rules: tuple[Rule, ...] = ()
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def group(self, size: int, stride: int = 1) -> GroupPlacement:
        key = (size, stride)
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = self._group(size, stride)
        return got

    def _group(self, size: int, stride: int) -> GroupPlacement:
        g = self.gpus_per_node
        per_node = 1 if stride >= g else max(1, min(size, g // stride))
        nodes = -(-size // per_node)
        rule = next((r for r in self.rules if r.matches(size, stride)), None)
        if rule is not None:
            return GroupPlacement(size, stride, per_node, nodes, rule.bytes_per_s, rule.source)
        if nodes == 1:
            return GroupPlacement(size, stride, per_node, 1, self.intra.bytes_per_s,
                                  "derived: the intra-node link")
        streams = max(1, g // per_node)
        share = self.nics_per_node * self.nic_bytes_per_s / streams
        bw = share if per_node == 1 else min(self.intra.bytes_per_s, share)
        return GroupPlacement(size, stride, per_node, nodes, bw,
                              f"derived: {self.nics_per_node} NICs a node shared by "
                              f"{streams} streams")

    def latency(self, op: str, size: int, stride: int = 1) -> float:
        """Seconds per call of ``op`` over the group (module docstring)."""
        if size <= 1:
            return 0.0
        gp = self.group(size, stride)
        steps = 1 if op == "send_recv" else RING_STEPS.get(op, 1) * (size - 1)
        if not gp.crosses_nodes:
            return steps * self.intra.latency_s
        ring = steps * self.inter.latency_s
        if op != "all_reduce":
            return ring
        tree = (2 * math.ceil(math.log2(gp.nodes)) * self.inter.latency_s
                + 2 * (gp.per_node - 1) * self.intra.latency_s)
        return min(ring, tree)

    def call(self, op: str, size: int, stride: int = 1) -> tuple[float, float]:
        """(seconds per call, seconds per byte a rank sends) of ``op`` over the group."""
        if size <= 1:
            return 0.0, 0.0
        return self.latency(op, size, stride), 1.0 / self.group(size, stride).bytes_per_s

    def to_dict(self) -> dict[str, Any]:
        """The profile form (a system profile's ``placement`` table)."""
        return {"gpus_per_node": self.gpus_per_node, "nics_per_node": self.nics_per_node,
                "nic_bytes_per_s": self.nic_bytes_per_s,
                "intra": [self.intra.bytes_per_s, self.intra.latency_s],
                "inter": [self.inter.bytes_per_s, self.inter.latency_s],
                "rules": [[r.stride_min, r.stride_max, r.size_min, r.size_max, r.bytes_per_s,
                           r.source] for r in self.rules]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        return cls(int(d["gpus_per_node"]), int(d["nics_per_node"]),
                   float(d["nic_bytes_per_s"]), Link(*map(float, d["intra"])),
                   Link(*map(float, d["inter"])),
                   tuple(Rule(int(a), None if b is None else int(b), int(c),
                              None if e is None else int(e), float(f), str(s))
                         for a, b, c, e, f, s in d.get("rules", [])))
