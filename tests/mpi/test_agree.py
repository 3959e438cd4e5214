"""agreed(): an error on some ranks is raised on all; the lowest failing rank keeps its own."""

from __future__ import annotations

import pytest

from plexgt.distributed.agree import agreed
from plexgt.errors import DataError, PeerFailed

from .conftest import RANK, WORLD

pytestmark = pytest.mark.timeout(120)


def test_no_failure_returns_every_ranks_value(dist_ctx):
    assert agreed(lambda: RANK * 10) == RANK * 10


@pytest.mark.parametrize("failing", [{WORLD - 1}, set(range(WORLD)), {0, WORLD - 1}])
def test_a_failure_anywhere_is_raised_everywhere(dist_ctx, failing):
    def step() -> int:
        if RANK in failing:
            raise DataError(f"rank {RANK}'s shard is bad")
        return 1

    first = min(failing)
    if RANK == first:
        with pytest.raises(DataError, match=f"rank {RANK}'s shard is bad") as e:
            agreed(step)
        assert e.value.agreed and e.value.origin == RANK
    else:
        with pytest.raises(PeerFailed, match=f"rank {first} failed"):
            agreed(step)
