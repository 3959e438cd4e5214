"""The compiled attention kernels built for older x86 ISAs than this machine's.

``make install`` builds with -march=native, so a CI machine with AVX-512 only ever tests the
AVX-512 code. Clusters' CPU nodes are often AVX2 only (AMD Milan, as on Perlmutter), and the
source has a separate register-held SpMM row for AVX2 and a plain-C++ one for anything else:
each is built here (about 30 s each, cached by torch across runs) and checked against torch's
kernels, float64 to 1e-12 and float32 to float rounding, forward and backward, at every
compiled head width.
"""

import os
import platform

import pytest
import torch

from plexgt.ops import native

from .test_ops_attention import _graph, _qkv
from .test_ops_native import NAT, _run

ISAS = {"x86-64-v3": "avx2"}
"""-march level -> the /proc/cpuinfo flag it needs here (None: any x86-64). AVX2 without AVX-512
is what the CPUs of Perlmutter's and Frontier's GPU nodes (AMD Zen 3) offer; the scalar
baseline (``x86-64``, 40 s of rebuild) runs with ``PLEXGT_ALL_ISAS=1``."""
if os.environ.get("PLEXGT_ALL_ISAS") == "1":
    ISAS["x86-64"] = None


def _cpu_flags() -> set[str]:
    line = native.cpu_flags_line()
    return set(line.split(":", 1)[1].split()) if ":" in line else set()


@pytest.mark.skipif(NAT is None, reason="compiled attention kernels unavailable here")
@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 ISA levels only")
@pytest.mark.parametrize("march", list(ISAS))
def test_kernels_built_for_an_older_isa_match_torch(march, monkeypatch):
    need = ISAS[march]
    if need is not None and need not in _cpu_flags():
        pytest.skip(f"this CPU lacks {need}, needed to run a -march={march} build")
    flags = [f for f in native.FLAGS if not f.startswith("-march")] + [f"-march={march}"]
    mod = native.build(f"plexgt_attention_cpu_{march.replace('-', '_')}", flags)
    monkeypatch.setitem(native._state, "module", mod)
    assert native.load() is mod
    graph = _graph(40, 60, 500, seed=1, empty_rows=(2,))
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 2e-5)):
        for d in native.WIDTHS:
            q, k, v = _qkv(40, 60, 3, d, dtype=dtype, seed=d)
            ours, ref = _run(graph, q, k, v, True), _run(graph, q, k, v, False)
            for a, b in zip(ours, ref):
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)
