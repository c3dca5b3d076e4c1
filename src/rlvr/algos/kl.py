"""Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens
(docs/algorithms.md#kl-penalty).

Tokens are sampled from the behaviour policy, so with logp = log pi_theta(o_t) and
ref = log pi_ref(o_t) each estimator is a function of one log-ratio per token. Following
J. Schulman, "Approximating KL divergence" (2020), which GRPO's k3 comes from:

    k1 = logp - ref                      unbiased, can be negative, high variance
    k2 = 0.5 * (logp - ref)^2            biased, >= 0, low variance
    k3 = exp(x) - x - 1,  x = ref - logp unbiased, >= 0, low variance (GRPO's choice)

Nothing is clamped (verl clamps k3 to [-10, 10]; we don't, because a clamp must be a
visible parameter): a huge log-ratio gives a huge k3, which is the honest value.
Masking is the caller's job; policy_loss zeroes masked inputs before calling these.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .settings import KLKind


def _upcast(t: Tensor) -> Tensor:
    # exp of log-prob differences in bf16/fp16 loses most digits
    # (docs/algorithms.md#notation-and-conventions).
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def kl_k1(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k1 = logp - ref. Its expectation under pi_theta is KL(pi_theta || pi_ref)."""
    return _upcast(log_probs) - _upcast(ref_log_probs)


def kl_k2(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k2 = 0.5 (logp - ref)^2. Biased as a value, but as a loss on on-policy samples its
    gradient, (logp - ref) grad logp, is an unbiased estimate of grad KL(pi_theta || pi_ref).
    """
    return 0.5 * (_upcast(log_probs) - _upcast(ref_log_probs)).square()


def kl_k3(log_probs: Tensor, ref_log_probs: Tensor) -> Tensor:
    """k3 = exp(x) - x - 1 with x = ref - logp (DeepSeekMath Eq. 4).

    Written as expm1(x) - x: for |x| ~ 1e-4 the naive exp(x) - 1 - x loses about half of
    its significant digits, while expm1 keeps them. Gradient wrt logp: 1 - exp(x), i.e.
    1 - pi_ref / pi_theta.
    """
    x = _upcast(ref_log_probs) - _upcast(log_probs)
    return torch.expm1(x) - x


KL_ESTIMATORS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "k1": kl_k1,
    "k2": kl_k2,
    "k3": kl_k3,
}
"""KL estimators by name; fn(log_probs, ref_log_probs) -> elementwise estimate."""


def kl_estimate(log_probs: Tensor, ref_log_probs: Tensor, kind: KLKind = "k3") -> Tensor:
    """Elementwise KL estimate of `kind` ("k1", "k2" or "k3"), shape of the inputs (B, T).

    Both inputs are log-probabilities of the *sampled* tokens under pi_theta and pi_ref and
    must have the same shape. bf16/fp16 inputs are computed and returned in fp32.
    """
    if kind not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {kind!r}; valid: {sorted(KL_ESTIMATORS)}")
    if log_probs.shape != ref_log_probs.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)} and ref_log_probs "
            f"{tuple(ref_log_probs.shape)} must have the same shape"
        )
    return KL_ESTIMATORS[kind](log_probs, ref_log_probs)
