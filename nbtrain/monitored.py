"""Which way a monitored held-out number improves, read from its name (mode="auto").

A name is read word by word (`val_top1_acc`: val, top1, acc). A word that names an error or a loss
says down, whatever else the name says (val_top1_error, val_acc_loss); otherwise a word that names a
score (an accuracy, an overlap, a correlation) says up. A name with neither is not guessed: the config
refuses it under mode="auto" and asks for mode="max" or "min".
"""
from __future__ import annotations

import re

GOES_DOWN = ("loss", "error", "err", "mse", "mae", "rmse", "msle", "nll", "perplexity", "ppl", "wer", "cer",
             "bpd", "bpc", "fid", "kl", "hamming", "miss", "misses", "fpr", "fnr", "eer")
GOES_UP = ("acc", "accuracy", "top1", "top5", "top", "f1", "fbeta", "precision", "recall", "auc", "auroc", "auprc",
           "roc", "iou", "miou", "jaccard", "dice", "map", "ap", "ndcg", "mrr", "hit", "hits", "hitrate", "r2",
           "bleu", "rouge", "meteor", "psnr", "ssim", "kappa", "mcc", "sensitivity", "specificity", "correct",
           "spearman", "pearson", "corr", "exact", "match")


def _words(name: str) -> list[str]:
    words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]
    # top1, map50, acc5: the word and its number; r2 and f1 are words themselves
    return words + [w.rstrip("0123456789") for w in words if w.rstrip("0123456789") not in ("", w)]


def direction(name: str) -> str | None:
    """'min' or 'max' for a monitored name under mode='auto', or None: the name says neither."""
    words = _words(name)
    if any(w in GOES_DOWN for w in words):
        return "min"
    if any(w in GOES_UP for w in words):
        return "max"
    return None


AUTO_WORDS = ("max for a score (acc, accuracy, top1, top5, f1, precision, recall, auc, iou, dice, map, r2, ...), "
              "min for an error or a loss (loss, error, mse, mae, rmse, perplexity, wer, cer, ...)")
AUTO_NOTE = f"auto: {AUTO_WORDS}; any other name needs mode='max' or 'min'"
