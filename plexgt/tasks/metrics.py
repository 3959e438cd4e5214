"""The task's metric: accuracy for multi-class labels, ROC-AUC for binary ones.

ROC-AUC is exact: the scores of every labelled node of a split are gathered to every rank
(:func:`plexgt.parallel.rows1d.row_scores`, :func:`plexgt.parallel.plexus3d.parallel_scores`)
and ranked, ties sharing their average rank (the Mann-Whitney statistic, what scikit-learn's
``roc_auc_score`` computes). Why not a binned approximation: a strong-scaling study compares
runs on different rank counts, which must report the same number.
"""

from __future__ import annotations

import numpy as np

METRICS = ("auto", "accuracy", "rocauc")


def resolve_metric(metric: str, num_classes: int) -> str:
    """'acc' or 'rocauc' (the metrics' key suffix) for the configured ``metric``: auto is
    ROC-AUC for two classes, accuracy otherwise; ROC-AUC needs two classes."""
    if metric == "auto":
        return "rocauc" if num_classes == 2 else "acc"
    if metric == "rocauc" and num_classes != 2:
        raise ValueError(f"metric rocauc needs binary labels; the graph has {num_classes} "
                         "classes (use accuracy)")
    return "acc" if metric == "accuracy" else metric


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` [k] for binary ``labels`` [k] (1 positive);
    NaN when a split holds only one class (the curve is undefined)."""
    scores = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(labels) == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(s.size, dtype=np.float64)
    start = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    end = np.r_[start[1:], s.size]
    ranks_sorted = np.repeat((start + end + 1) / 2.0, end - start)  # 1-based average ranks
    ranks[order] = ranks_sorted
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))
