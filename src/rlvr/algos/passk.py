"""pass@k with the unbiased estimator of Chen et al. (2021), "Evaluating Large Language
Models Trained on Code", eq. 1: from n >= k samples of a problem, c of them correct,

    pass@k = 1 - C(n - c, k) / C(n, k),

the probability that k samples drawn without replacement from the n hold a correct one,
averaged over problems. Computed as the paper's numerically stable product
1 - prod_{i = n-c+1}^{n} (1 - k / i), exact where the binomials would overflow a float.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with `c` correct of `n` samples (k <= n)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:  # every draw of k holds a correct sample
        return 1.0
    keep = 1.0
    for i in range(n - c + 1, n + 1):
        keep *= 1.0 - k / i
    return 1.0 - keep


def problem_counts(samples: Iterable[tuple[object, bool]]) -> dict[object, tuple[int, int]]:
    """{problem: (n, c)} from (problem, correct) pairs, in first-seen order."""
    counts: dict[object, list[int]] = {}
    for problem, ok in samples:
        nc = counts.setdefault(problem, [0, 0])
        nc[0] += 1
        nc[1] += bool(ok)
    return {p: (n, c) for p, (n, c) in counts.items()}


def pass_at_ks(counts: dict[object, tuple[int, int]], ks: Sequence[int]) -> dict[str, float]:
    """{"pass@k": mean over problems} for each k that every problem has n >= k samples for
    (HumanEval's rule: a k past some problem's n is left out)."""
    if not counts:
        return {}
    least = min(n for n, _ in counts.values())
    return {
        f"pass@{k}": sum(pass_at_k(n, c, k) for n, c in counts.values()) / len(counts)
        for k in sorted(set(ks))
        if 1 <= k <= least
    }
