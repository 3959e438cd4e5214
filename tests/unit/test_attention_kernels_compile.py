"""The fused attention kernels compile for a GPU, here without one.

The interpreter (the other tests) runs the kernels' arithmetic with numpy, which takes block
shapes and broadcasts Triton's compiler refuses (a block dimension not a power of two, a
pointer added to a pointer, ...). Triton can compile ahead of time for a target it is told,
through PTX to a cubin with the ptxas its wheel ships, so the configurations
:func:`~plexgt.ops.attention_triton.blocks` picks are compiled here for an H100 (sm_90):
the head-group tiles [BLOCK_R, BLOCK_E, HG, BLOCK_D] of every kernel, bf16 and float32.
"""

import os
import re
import subprocess
import sys

import pytest

from plexgt.ops import attention_kernels as kernels
from plexgt.ops import attention_triton

triton = attention_triton.triton
pytestmark = [pytest.mark.skipif(triton is None, reason="triton is not installed"),
              pytest.mark.timeout(300)]
INDEX = {"seg_row", "seg_start", "seg_end", "seg_col", "indices", "tindices", "tperm",
         "long_row", "long_col", "cptr"}
STATS = {"scale_ptr", "lse", "delta", "pm", "pl", "pacc", "part", "y"}
FLAGS = {"HAS_BIAS": True, "ACCUMULATE": True, "NEED_DQ": True, "NEED_DB": True,
         "NEED_DK": True, "NEED_DV": True, "STAGES": 3}


def _signature(fn, dtype: str, const: dict) -> dict[str, str]:
    sig = {}
    for name in fn.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif re.fullmatch(r"s[a-z]{1,3}[01]", name) or name in ("n_seg", "h", "deg", "n_long"):
            sig[name] = "i32"
        else:
            sig[name] = "*i32" if name in INDEX else "*fp32" if name in STATS else "*" + dtype
    return sig


def compile_all(heads: int, d: int, dtype: str) -> int:
    """Compile every kernel at blocks()' configuration for (heads, d'); the kernels compiled.
    Run in a process without TRITON_INTERPRET (the interpreter's functions do not compile)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", 90, 32)
    cfg = attention_triton.blocks(1000, 20000, d, heads)
    tile = {"D": d, "BLOCK_R": cfg.block_r, "BLOCK_E": cfg.block_e, "HG": cfg.heads,
            "BLOCK_D": cfg.block_d}
    merge = attention_triton._merge_cfg(cfg)
    done = 0
    for fn, partial in ((kernels.fwd_kernel, False), (kernels.fwd_kernel, True),
                        (kernels.bwd_rows_kernel, True), (kernels.bwd_cols_kernel, True),
                        (kernels.merge_fwd_kernel, None), (kernels.merge_sum_kernel, None)):
        if partial is None:
            const = {"D": d, "BLOCK_R": merge.block_r, "HG": merge.heads,
                     "BLOCK_D": merge.block_d, "ACCUMULATE": True}
        else:
            const = {**tile, **{k: v for k, v in FLAGS.items() if k in fn.arg_names},
                     "PARTIAL": partial}
            if partial and "ACCUMULATE" in const:
                const["ACCUMULATE"] = False
        src = ASTSource(fn=fn, signature=_signature(fn, dtype, const), constexprs=const)
        assert "cubin" in triton.compile(src, target=target).asm, fn.__name__
        done += 1
    return done


def test_every_kernel_compiles_at_the_chosen_blocks():
    """All heads in one group (8 heads of 16, bf16) and a partial group of a masked head
    (3 heads of 200 in groups of 2, float32): one process, both compiled."""
    try:
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except ImportError:
        pytest.skip("this Triton has no ahead-of-time compile API")
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    code = ("from tests.unit.test_attention_kernels_compile import compile_all; "
            "print('compiled', compile_all(8, 16, 'bf16') + compile_all(3, 200, 'fp32'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0 and "compiled 12" in out.stdout, out.stderr[-3000:]
