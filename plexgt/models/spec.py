"""What ``plexgt train --model NAME`` needs to know of a model: :class:`ModelSpec`.

Each model is one module of :mod:`plexgt.models` ending in its ``SPEC``; the registry
(:mod:`plexgt.models.registry`) lists them, and everything that takes a model name (the
config check, ``--model``'s choices, the task builders, the planners) reads the spec, so a
model's name is written in its module and the registry only.

Two layouts carry every model:

* ``grid3d``: every layer is ``H' = act(sum_k Op_k · (H W_k) + b)`` over graph operators
  Op_k, on the 3D tensor-parallel grid (:mod:`plexgt.parallel.plexus3d`). An operator is one
  of :data:`OPERATORS`; the distributed path builds each rank's block of each from the
  prepared pattern and degrees at load, so a new model of this form is its reference module
  and its operator list.
* ``attention``: node rows with an attention strategy (:mod:`plexgt.parallel.attention`).
* ``batch``: sampled node sequences (:mod:`plexgt.data.node_batches`) with dense attention
  over each, on a dp x pp x cp mesh (data, pipeline and context parallelism); the
  ``parallel.dp/pp/cp/stages/micro_batches`` keys and the ``[batch]`` table are its.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

LAYOUTS = ("grid3d", "attention", "batch")

OPERATORS = {
    "gcn": "Â = D^-1/2 A D^-1/2, symmetric normalisation (Kipf & Welling)",
    "mean": "M = D^-1 A, the mean over a node's in-neighbours (GraphSAGE's mean aggregator)",
    "self": "I, the node itself (no graph)",
}
"""The graph operators of grid3d layers. A is the prepared pattern (with one self loop per
node unless prep was told --no-self-loops), D its row counts."""


@dataclass(frozen=True)
class ModelSpec:
    """One model, as the command line, the configuration and the task builders see it."""

    name: str
    """``--model`` / ``model.name``."""
    help: str
    """One line for --help and the docs."""
    reference: type
    """The single-process model (the oracle every layout is tested against), constructed
    as ``reference(in_dim, hidden, out_dim, num_layers=, dropout=, input_dropout=, seed=)``
    for grid3d models."""
    layout: str
    """One of :data:`LAYOUTS`."""
    operators: tuple[str, ...] = ()
    """grid3d: each layer's operators, in the order of the reference's parameter lists
    (:func:`parameter_lists`); the first carries the layer's bias."""
    plan_as: str = ""
    """The model the planners price this one as ('' = itself): grid3d models are gcn's
    collectives, an approximation where the operators differ (below)."""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"model {self.name!r}: layout {self.layout!r} is not one of "
                             f"{', '.join(LAYOUTS)}")
        unknown = [op for op in self.operators if op not in OPERATORS]
        if unknown or (self.layout == "grid3d") != bool(self.operators):
            raise ValueError(f"model {self.name!r}: operators {self.operators!r} (grid3d "
                             f"models take one or more of {', '.join(OPERATORS)})")

    @property
    def attention(self) -> bool:
        """Whether the model has attention (heads, super nodes, strategies)."""
        return self.layout == "attention"

    @property
    def planned_as(self) -> str:
        return self.plan_as or self.name


def parameter_lists(operators: tuple[str, ...]) -> list[str]:
    """The reference's parameter list of each operator: 'layers' for the first (weights and
    biases, nn.Linear), '<op>_layers' for the others (weights only): the names a checkpoint
    holds (``layers.0.weight``, ``self_layers.0.weight``)."""
    return ["layers"] + [f"{op}_layers" for op in operators[1:]]


class ModelRegistry:
    """Models by name. Build with :func:`plexgt.models.registry.default_registry`; add with
    :meth:`register`."""

    def __init__(self) -> None:
        self._items: dict[str, ModelSpec] = {}

    def register(self, spec: ModelSpec, replace: bool = False) -> ModelSpec:
        if spec.name in self._items and not replace:
            raise ValueError(f"model {spec.name!r} is already registered")
        self._items[spec.name] = spec
        return spec

    def get(self, name: str) -> ModelSpec:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown model {name!r}; known: {', '.join(self._items)}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items
