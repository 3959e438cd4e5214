#!/usr/bin/env bash
# ogbn-papers100M (111M nodes, 1.6B directed citations, 128 float16 features) -> prepared dir.
# RAW is the OGB download root (holds raw/data.npz, raw/node-label.npz, split/time/).
# Streamed and parallel: run it under your launcher, e.g.
#   srun -n 64 data_prep/ogbn-papers100M.sh /data/ogbn_papers100M /scratch/papers100M
#   mpiexec -n 16 data_prep/ogbn-papers100M.sh RAW OUT --tiles 64
# Extra arguments are passed to plexgt prep (e.g. --resume after an interrupted run).
set -euo pipefail
RAW=${1:?usage: $0 RAW_DIR OUT_DIR [prep options]}; OUT=${2:?usage: $0 RAW_DIR OUT_DIR}; shift 2
exec "${PYTHON:-python}" -m plexgt prep --format ogb --input "$RAW" --out "$OUT" \
    --symmetrize --features-dtype float16 "$@"
