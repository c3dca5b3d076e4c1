"""The reward model as the training reward, and DeepSeekMath's iterative RL around it.

`ModelRewardScorer` wraps the rule's `Scorer`: the total reward's accuracy term becomes the
reward model's probability that the response is correct, sigmoid(logit) in (0, 1), in place
of the rule's score; everything else the trainer reads as "correct" (the accuracy metrics, the
held-out evaluation) stays the rule's verdict, so a run judged by the rule can be trained by
the model. Each training step's responses are kept with both verdicts: `rm/agreement` is the
share where the model's (logit > 0) equals the rule's, so reward hacking shows as the two
diverging; `rm/auc` is the model's ranking of them against the rule's (when both verdicts
occur): agreement alone is high for a model that calls everything wrong once everything is.

`IterativeRM` is the outer loop (`reward.model_refresh_every = M`): after every M steps the
reward model trains further (BCE, AdamW at `reward.rm_lr`, `reward.rm_epochs` passes) on the
iteration's responses labelled by the rule plus a replay sample of `reward.rm_replay_frac` of
the historical data (every earlier iteration's responses and, for an `rlvr rm` run directory,
the responses it was trained on), drawn from (seed, iteration) alone. Under torchrun rank 0
trains on every rank's responses and broadcasts the weights. Its whole state (weights, the
iteration's responses so far, the history) goes into each checkpoint, so a run resumed in the
middle of an iteration refreshes exactly as the uninterrupted one.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from rlvr.rewards.scoring import Scorer, Scores
from rlvr.rm.collect import records_from
from rlvr.rm.fit import fit, make_optimizer
from rlvr.rm.metrics import agreement, auc
from rlvr.rm.model import RewardModel
from rlvr.rm.records import Record, read_records
from rlvr.rollout import derive_seed
from rlvr.run.distributed import Dist

REFRESH_BATCH_GROUPS = 8


def load_reward_model(path: str, device) -> tuple[RewardModel, list[Record]]:
    """The reward model `reward.model` names and its training data (from an `rlvr rm` run
    directory: `model/` and `data/train.jsonl`; a plain model directory has none)."""
    root = Path(path)
    history: list[Record] = []
    if (root / "rm.yaml").is_file() and (root / "model").is_dir():
        if (root / "data" / "train.jsonl").is_file():
            history = read_records(root / "data" / "train.jsonl")
        root = root / "model"
    rm = RewardModel.load(root)
    rm.model.to(device)
    return rm, history


class ModelRewardScorer:
    """The rule's scorer with the reward model's probability as the accuracy term."""

    def __init__(self, rule: Scorer, rm: RewardModel):
        self.rule, self.rm = rule, rm
        self.fresh: list[Record] = []
        self.fresh_logits: list[torch.Tensor] = []
        self.next_group = 0

    def __getattr__(self, name):  # cfg, task, state, reward_kwargs: the rule scorer's
        return getattr(self.rule, name)

    def accuracy(self, prompts, completions, rollout):
        """The held-out evaluation's verdict: the rule's."""
        return self.rule.accuracy(prompts, completions, rollout)

    def __call__(
        self, prompts, completions, rollout, step: int | None = None, given=None, given_terms=None
    ) -> Scores:
        """The rule's scores (`given`: an agent's rewards as its accuracy, `Scorer`'s) with the
        accuracy term replaced by the reward model's probability."""
        s = self.rule(
            prompts, completions, rollout, step=step, given=given, given_terms=given_terms
        )
        logits = self.rm.score([p.text for p in prompts], completions)
        prob = torch.sigmoid(logits)
        w = self.rule.cfg.reward.accuracy_weight
        total = s.total - w * s.terms["accuracy"] + w * prob
        if step is not None:  # a training step's responses
            G, first = rollout.group_size, self.next_group
            self.fresh += records_from(prompts, completions, s.correct, lambda i: first + i // G)
            self.fresh_logits.append(logits)
            self.next_group += len(prompts) // G
        return replace(s, total=total, terms={**s.terms, "model": prob})

    def take(self) -> tuple[list[Record], torch.Tensor]:
        """The responses scored since the last call, with their logits."""
        records, logits = self.fresh, torch.cat(self.fresh_logits or [torch.zeros(0)])
        self.fresh, self.fresh_logits = [], []
        return records, logits


def replay_sample(history: list[Record], frac: float, seed: int) -> list[Record]:
    """round(frac * len(history)) distinct records of the history, drawn from `seed`."""
    k = round(frac * len(history))
    g = torch.Generator().manual_seed(seed)
    return [history[int(i)] for i in torch.randperm(len(history), generator=g)[:k]]


def renumber(records: list[Record], source: int) -> list[Record]:
    """Group ids made unique across sources (ranks, history): (source, group) in order."""
    ids: dict[int, int] = {}
    return [replace(r, group=source * 10**9 + ids.setdefault(r.group, len(ids))) for r in records]


class IterativeRM:
    def __init__(self, scorer: ModelRewardScorer, cfg, d: Dist, history: list[Record]):
        self.scorer, self.cfg, self.d = scorer, cfg, d
        self.history = history
        self.iteration: list[Record] = []
        self.refreshes = 0

    def after_step(self, step: int) -> tuple[dict[str, float], bool]:
        """This step's agreement metrics; and whether an iteration ended (a refresh ran)."""
        records, logits = self.scorer.take()
        labels = torch.tensor([r.correct for r in records], dtype=torch.bool)
        agree, n = self.d.sum([agreement(logits, labels) * len(records), float(len(records))])
        metrics = {"rm/agreement": agree / max(n, 1.0)}
        every_rank = self.d.gather((logits, labels))
        ranking = auc(torch.cat([x for x, _ in every_rank]), torch.cat([y for _, y in every_rank]))
        if ranking is not None:  # both verdicts among the step's responses
            metrics["rm/auc"] = ranking
        self.iteration += records
        every = self.cfg.reward.model_refresh_every
        if not every or step % every:
            return metrics, False
        metrics.update(self.refresh())
        return metrics, True

    def refresh(self) -> dict[str, float]:
        """Train on this iteration's responses plus the replay sample; start the next one."""
        r, seed = self.cfg.reward, self.cfg.train.seed
        t0 = time.perf_counter()
        new = [x for k, part in enumerate(self.d.gather(self.iteration)) for x in renumber(part, k)]
        replay = renumber(
            replay_sample(self.history, r.rm_replay_frac, derive_seed(seed, "rm-replay", self.refreshes)),
            self.d.world_size,
        )  # fmt: skip
        losses: list[float] = []
        rm = self.scorer.rm
        if self.d.is_main:
            fit(rm, new + replay, make_optimizer(rm, r.rm_lr), loss="bce", epochs=r.rm_epochs,
                batch_groups=REFRESH_BATCH_GROUPS, seed=derive_seed(seed, "rm-refresh", self.refreshes),
                on_step=lambda _s, row: losses.append(row["rm/loss"]))  # fmt: skip
        if self.d.enabled:
            weights = self.d.broadcast({k: v.cpu() for k, v in rm.model.state_dict().items()})
            rm.model.load_state_dict(weights)
        self.history += new
        self.iteration = []
        self.refreshes += 1
        loss = self.d.broadcast(sum(losses) / len(losses) if losses else float("nan"))
        return {"rm/refresh": 1.0, "rm/refresh_loss": loss, "rm/refresh_responses": len(new),
                "rm/replay_responses": len(replay),
                "time/rm_refresh": time.perf_counter() - t0}  # fmt: skip

    def state(self) -> dict:
        return {
            "weights": {k: v.detach().cpu().clone() for k, v in self.scorer.rm.model.state_dict().items()},
            "iteration": [asdict(x) for x in self.iteration],
            "history": [asdict(x) for x in self.history],
            "refreshes": self.refreshes,
            "next_group": self.scorer.next_group,
        }  # fmt: skip

    def load_state(self, state: dict) -> None:
        self.scorer.rm.model.load_state_dict(state["weights"])
        self.iteration = [Record(**x) for x in state["iteration"]]
        self.history = [Record(**x) for x in state["history"]]
        self.refreshes = state["refreshes"]
        self.scorer.next_group = state["next_group"]
