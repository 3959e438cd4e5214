"""Stage-to-stage point-to-point transfers of a pipeline, as autograd Functions, with ledger bytes.

=====================  ==========================================================
forward                backward (the adjoint)
=====================  ==========================================================
:func:`send_forward`   receives the output's gradient from the next stage
:func:`recv_forward`   sends the input's gradient back to the previous stage
=====================  ==========================================================

Stage s's forward of a micro-batch is ``x = recv_forward(...)`` (s > 0), ``y = f(x)``,
``token = send_forward(y, ...)`` (s < P - 1); its backward is ``token.backward()``: autograd
runs send_forward's backward (receive dL/dy from s + 1), then f's, then recv_forward's (send
dL/dx to s - 1). A schedule needs no hand-written gradient plumbing.

Both sides know every message's shape (the caller passes it): no shape handshake. Sends are
non-blocking (``isend``) and waited for by :meth:`Pipe.flush`, so a stage goes on computing
while its output travels; receives block (the data is needed now).

Bytes: one message of an activation [B, S, d] is its ``numel * element_size``, the same
forward (activation) and backward (its gradient); :func:`pipeline_p2p_bytes` is the whole
step's per-rank count, which the ledger records under the pipe's name ('pp') and the ops
'activation' and 'gradient'.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from plexgt.distributed.collectives import CommLedger

ACTIVATION = "activation"
"""Ledger op of a forward message (stage s -> s + 1)."""
GRADIENT = "gradient"
"""Ledger op of a backward message (stage s + 1 -> s)."""


def message_bytes(shape: Sequence[int], element_size: int) -> int:
    """Bytes of one message: an activation of ``shape`` (or its gradient)."""
    return math.prod(shape) * element_size


def pipeline_p2p_bytes(stage: int, pp: int, messages: Sequence[int]
                       ) -> dict[str, tuple[int, int]]:
    """(sent, received) bytes per ledger op of one rank of ``stage`` in a ``pp``-stage pipeline
    over one step, ``messages[k]`` the bytes of micro-batch k's activation between two stages.

    A stage sends its output forward and receives its output's gradient from the next stage
    (unless last), and receives its input and sends the input's gradient back (unless first):
    each micro-batch crosses every boundary twice."""
    total = sum(messages)
    has_next, has_prev = stage < pp - 1, stage > 0
    return {ACTIVATION: (total if has_next else 0, total if has_prev else 0),
            GRADIENT: (total if has_prev else 0, total if has_next else 0)}


@dataclass
class Pipe:
    """One rank's place in its pipeline: the global ranks of its neighbour stages' peers (same
    replica, same cp rank), the group holding them (same d, c) and the rank's ledger.

    Built from :class:`~plexgt.distributed.mesh.MeshGroups` as
    ``Pipe(groups.prev, groups.next, groups.pipe, ledger)``."""

    prev: int | None
    """Global rank of the previous stage's peer (None on the first stage)."""
    next: int | None
    """Global rank of the next stage's peer (None on the last stage)."""
    group: Any
    """The torch.distributed group holding this rank's pipeline (None: the world)."""
    ledger: CommLedger
    name: str = "pp"
    """The ledger's group name."""
    grads_sent: int = 0
    """Input gradients sent back so far (the schedule checks every micro-batch sent one)."""
    _pending: list[tuple[Any, torch.Tensor]] = field(default_factory=list, repr=False)

    def _send(self, x: torch.Tensor, to: int, op: str) -> None:
        x = x.contiguous()
        self.ledger.record(self.name, op, message_bytes(x.shape, x.element_size()), 0)
        with self.ledger.timed():
            work = dist.isend(x, to, group=self.group)
        self._pending.append((work, x))  # x kept alive until the send is done

    def _recv(self, shape: Sequence[int], dtype: torch.dtype, device: torch.device,
              frm: int, op: str) -> torch.Tensor:
        out = torch.empty(tuple(shape), dtype=dtype, device=device)
        self.ledger.record(self.name, op, 0, message_bytes(out.shape, out.element_size()))
        with self.ledger.timed():
            dist.recv(out, frm, group=self.group)
        return out

    def send_gradient(self, g: torch.Tensor) -> None:
        """Send an input's gradient to the previous stage (no autograd)."""
        if self.prev is None:
            raise RuntimeError("the first stage has no previous stage to send a gradient to")
        self._send(g, self.prev, GRADIENT)
        self.grads_sent += 1

    def flush(self) -> None:
        """Wait until every send issued so far is done (timed in the ledger)."""
        with self.ledger.timed():
            for work, _ in self._pending:
                work.wait()
        self._pending.clear()


class _SendForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, anchor: torch.Tensor, pipe: Pipe) -> torch.Tensor:
        ctx.pipe, ctx.meta = pipe, (x.shape, x.dtype, x.device)
        ctx.needs_x = ctx.needs_input_grad[0]
        pipe._send(x.detach(), pipe.next, ACTIVATION)
        return anchor.new_zeros(())

    @staticmethod
    def backward(ctx: Any, _: torch.Tensor) -> tuple[Any, ...]:
        shape, dtype, device = ctx.meta
        g = ctx.pipe._recv(shape, dtype, device, ctx.pipe.next, GRADIENT)
        return (g if ctx.needs_x else None), None, None


class _RecvForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype,
                pipe: Pipe) -> torch.Tensor:
        ctx.pipe = pipe
        return pipe._recv(shape, dtype, anchor.device, pipe.prev, ACTIVATION)

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:
        ctx.pipe.send_gradient(g)
        return None, None, None, None


def _anchor(device: torch.device) -> torch.Tensor:
    """A leaf that requires grad, input to both Functions so autograd always runs their
    backward (the peer waits for the message whatever this stage's parameters need)."""
    return torch.zeros((), device=device, requires_grad=True)


def send_forward(y: torch.Tensor, pipe: Pipe) -> torch.Tensor:
    """Send this stage's output ``y`` to the next stage; returns a 0-d token whose
    ``backward()`` receives dL/dy from the next stage (same shape as ``y``) and carries it on
    through this stage's graph. The send is waited for by :meth:`Pipe.flush`."""
    if pipe.next is None:
        raise RuntimeError("the last stage has no next stage to send its output to")
    return _SendForward.apply(y, _anchor(y.device), pipe)


def recv_forward(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str,
                 pipe: Pipe) -> torch.Tensor:
    """Receive this stage's input [``shape``] from the previous stage; it requires grad, and
    its backward sends the gradient back to the previous stage."""
    if pipe.prev is None:
        raise RuntimeError("the first stage has no previous stage to receive its input from")
    return _RecvForward.apply(_anchor(torch.device(device)), tuple(int(s) for s in shape),
                              dtype, pipe)
