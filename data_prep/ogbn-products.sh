#!/usr/bin/env bash
# ogbn-products (2.4M nodes, 61.9M edges stored one direction, 100 features) -> prepared dir.
# RAW is the OGB download root (raw/edge.csv.gz, raw/node-feat.csv.gz, split/sales_ranking/).
#   data_prep/ogbn-products.sh /data/ogbn_products /scratch/products
set -euo pipefail
RAW=${1:?usage: $0 RAW_DIR OUT_DIR [prep options]}; OUT=${2:?usage: $0 RAW_DIR OUT_DIR}; shift 2
exec "${PYTHON:-python}" -m plexgt prep --format ogb --input "$RAW" --out "$OUT" \
    --symmetrize "$@"
