"""The task's metric: accuracy for multi-class labels, ROC-AUC for binary ones, the mean
ROC-AUC over tasks for multi-label ones (as OGB's evaluator computes it for ogbn-proteins:
each task over its labelled nodes, tasks whose split holds one class only left out).

ROC-AUC is exact: the scores of every labelled node of a split are gathered to every rank
(:func:`plexgt.parallel.rows1d.row_scores`, :func:`plexgt.parallel.plexus_loss.parallel_scores`)
and ranked, ties sharing their average rank (the Mann-Whitney statistic, what scikit-learn's
``roc_auc_score`` computes). Why not a binned approximation: a strong-scaling study compares
runs on different rank counts, which must report the same number.
"""

from __future__ import annotations

import numpy as np

METRICS = ("auto", "accuracy", "rocauc")


def resolve_metric(metric: str, num_classes: int, multilabel: bool = False) -> str:
    """'acc' or 'rocauc' (the metrics' key suffix) for the configured ``metric``: auto is
    ROC-AUC for two classes or multi-label tasks, accuracy otherwise; ROC-AUC needs either,
    accuracy needs class labels."""
    if multilabel:
        if metric == "accuracy":
            raise ValueError(f"metric accuracy needs class labels; the graph has "
                             f"{num_classes} multi-label tasks (use rocauc)")
        return "rocauc"
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


def task_roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """ROC-AUC of binary scores and labels [k], or the mean over tasks of multi-label ones
    [k, T] (label -1: unlabelled for that task; tasks with one class only skipped; NaN when
    none has both)."""
    if np.ndim(labels) == 1:
        return roc_auc(scores, labels)
    per = [roc_auc(scores[known, t], labels[known, t])
           for t in range(labels.shape[1]) for known in [labels[:, t] >= 0]]
    per = [a for a in per if a == a]
    return float(np.mean(per)) if per else float("nan")
