"""Suite-wide set-up that must precede every import of plexgt.

Without a GPU, Triton kernels run under Triton's CPU interpreter: the flag is read when a
kernel is decorated, so it is set here, before any test module imports
:mod:`plexgt.ops.attention_triton`. On a GPU machine the kernels are compiled for real.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
