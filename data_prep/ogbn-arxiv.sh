#!/usr/bin/env bash
# ogbn-arxiv (169K nodes, 1.17M directed citations, 128 features) -> prepared dir, symmetrised
# as is usual for GCN baselines. RAW is the OGB root (raw/*.csv.gz, split/time/).
#   data_prep/ogbn-arxiv.sh /data/ogbn_arxiv /scratch/arxiv
set -euo pipefail
RAW=${1:?usage: $0 RAW_DIR OUT_DIR [prep options]}; OUT=${2:?usage: $0 RAW_DIR OUT_DIR}; shift 2
exec "${PYTHON:-python}" -m plexgt prep --format ogb --input "$RAW" --out "$OUT" \
    --symmetrize "$@"
