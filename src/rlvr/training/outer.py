"""What happens between steps, on clocks of its own: reference resets (`algo.ref_sync_every`,
`rlvr.training.reference`) and DeepSeekMath's outer loop around a reward model
(`reward.model`, `reward.model_refresh_every`, `rlvr.rm.iterative`):

    for iteration = 1..I:
        reference <- policy
        for step = 1..M: the GRPO step
        update the reward model by continual training with replay

The reset that opens iteration i + 1 runs right after iteration i's refresh; when
`algo.ref_sync_every` is set, resets follow that clock instead. Both states go into every
checkpoint (`state`, `load_state`), so a resumed run continues the same outer loop.
"""

from __future__ import annotations

from rlvr.training.reference import ReferenceSync


class OuterLoop:
    def __init__(self, run):
        cfg = run.cfg
        self.cfg = cfg
        self.reference = None
        if run.algorithm.needs_reference:
            self.reference = ReferenceSync(run.policy, run.backend, cfg.algo.ref_mixup_alpha)
        self.rm = None
        if cfg.reward.model is not None:
            from rlvr.rm.iterative import IterativeRM, ModelRewardScorer, load_reward_model

            rm, history = load_reward_model(cfg.reward.model, run.device)
            run.scorer = ModelRewardScorer(run.scorer, rm)
            self.rm = IterativeRM(run.scorer, cfg, run.d, history)

    def after_step(self, step: int) -> dict[str, float]:
        metrics: dict[str, float] = {}
        iteration_ended = False
        if self.rm is not None:
            got, iteration_ended = self.rm.after_step(step)
            metrics.update(got)
        every = self.cfg.algo.ref_sync_every
        reset = step % every == 0 if every else iteration_ended
        if reset and self.reference is not None:
            self.reference.reset()
            metrics["ref/reset"] = 1.0
        return metrics

    def state(self) -> dict:
        return {
            "reference": self.reference.state() if self.reference is not None else None,
            "reward_model": self.rm.state() if self.rm is not None else None,
        }

    def load_state(self, state: dict) -> None:
        if self.reference is not None:
            self.reference.load_state(state.get("reference"))
        if self.rm is not None and state.get("reward_model") is not None:
            self.rm.load_state(state["reward_model"])


def build_outer(run) -> OuterLoop | None:
    """The run's outer loop, or None when it has nothing to do between steps."""
    cfg = run.cfg
    if cfg.algo.ref_sync_every or cfg.reward.model is not None:
        return OuterLoop(run)
    return None
