#!/bin/bash
# Strong-scaling sweep: one job per scale, same data and model. Parameters as env vars:
#   SCRIPT=jobscripts/perlmutter/train.sbatch SCALES="4 8 16 32" DATA=... bash jobscripts/sweep.sh
# Ranks per node follow the machine: 4 on Perlmutter (A100s), 8 on Frontier (MI250X GCDs).
set -euo pipefail
SCRIPT=${SCRIPT:-jobscripts/generic/train.sbatch}
SCALES=${SCALES:-"1 2 4 8"}
case "$SCRIPT" in
    *frontier*) RANKS_PER_NODE=${RANKS_PER_NODE:-8} ;;
    *) RANKS_PER_NODE=${RANKS_PER_NODE:-4} ;;
esac
SWEEP_DIR=${SWEEP_DIR:-runs/sweep-$(date +%Y%m%d-%H%M%S)}

mkdir -p "$SWEEP_DIR"
for p in $SCALES; do
    nodes=$(( (p + RANKS_PER_NODE - 1) / RANKS_PER_NODE ))
    per=$(( p < RANKS_PER_NODE ? p : RANKS_PER_NODE ))
    RUN_DIR="$SWEEP_DIR/p$p" sbatch --nodes="$nodes" --ntasks-per-node="$per" \
        --job-name="plexgt-p$p" --export=ALL,RUN_DIR="$SWEEP_DIR/p$p" "$SCRIPT"
done
echo "submitted; when done: python -m perf.strong_scaling --runs $SWEEP_DIR"
