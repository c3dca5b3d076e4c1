"""The built-in `arithmetic` task written as a `verifiers` 0.4 (`verifiers.v1`) environment:
its rows are the taskset's tasks, the task's verifier the reward function (1 right, -1 wrong:
the dapo preset's reward.correct_score and reward.wrong_score), and a second, unweighted term
(`answer_tag`: an <answer> block present) shows how several reward functions reach the metrics.

    pip install "rlvr[verifiers]"
    rlvr train --env verifiers:examples/verifiers_arithmetic.py:load_environment
    # or: rlvr.train("rlvr-tiny", environment=load_environment())

The taskset's id is this module's name: `verifiers` imports a taskset by the module that
holds it, so the module must be importable (rlvr puts its directory on sys.path).
"""

from __future__ import annotations

import sys
from pathlib import Path

import verifiers.v1 as vf

from rlvr.tasks import TASKS
from rlvr.tasks.base import Example, extract_answer

__all__ = ["ArithmeticTaskset", "ChatHarness", "load_environment"]

TRAIN_ROWS = 4000  # the built-in run's data.train_size
SEED = 0  # the built-in run's train.seed: these are the rows `rlvr train` trains on


class ArithmeticData(vf.TaskData):
    question: str
    answer: str


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ArithmeticData, trace: vf.Trace) -> float:
        """The built-in task's verifier: the one <answer> block holds the answer."""
        example = Example(task.question, task.answer)
        return 1.0 if TASKS["arithmetic"].verify(trace.last_reply, example) else -1.0

    @vf.reward(weight=0.0)
    async def answer_tag(self, task: ArithmeticData, trace: vf.Trace) -> float:
        """Logged, not trained on (weight 0): the reply holds an <answer> block."""
        return float(extract_answer(trace.last_reply) is not None)


class ArithmeticTaskset(vf.Taskset[ArithmeticTask]):
    """The built-in run's training rows (split "train", seed 0); its held-out rows (split
    "test") stay out, for rlvr's evaluation."""

    def load(self):
        task = TASKS["arithmetic"]
        for ex in task.make_examples("train", TRAIN_ROWS, SEED):
            data = ArithmeticData(
                prompt=task.instruction(ex), question=ex.question, answer=ex.answer
            )
            yield ArithmeticTask(data, self.config.task)


class ChatHarnessConfig(vf.HarnessConfig):
    turns: int = 1
    """Model turns: after each reply but the last, `follow_up` is the user's next message."""
    follow_up: str = "Check it and answer again."


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """A chat loop run in-process (verifiers' contract: every model call goes through the
    interception `endpoint`, which records the trace). The `null` harness runs the same loop
    as a program of its own, one process per rollout, its packages installed by `uv`."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data,
                     tool_interception_url=None) -> vf.ProgramResult:  # fmt: skip
        import openai

        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        messages += [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [
            m.model_dump(mode="json", exclude_none=True) for m in prompt or []]  # fmt: skip
        # one timeout for every phase: a batch of 128 rollouts connecting at once on a busy
        # 2-core host passed openai's 5 s connect timeout; the run's env.timeout bounds the call
        client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, timeout=300.0)
        async with client:
            for turn in range(self.config.turns):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages)
                # the reply as returned (its reasoning_content too): verifiers then matches it
                # to the sampled turn and the next prompt extends the sampled ids
                messages.append(reply.choices[0].message.model_dump(exclude_none=True))
                if turn + 1 < self.config.turns:
                    messages.append({"role": "user", "content": self.config.follow_up})
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


def load_environment(harness: str = "chat", turns: int = 1) -> vf.SingleAgentEnv:
    """The environment: one seat; `harness` "chat" (ChatHarness, in-process, `turns` model
    turns) or a verifiers harness id ("null": its chat program, a process per rollout)."""
    here, name = str(Path(__file__).resolve().parent), Path(__file__).stem
    if here not in sys.path:
        sys.path.insert(0, here)
    spec = {"id": name, "turns": turns} if harness == "chat" else {"id": harness}
    config = vf.SingleAgentEnvConfig(
        taskset=vf.TasksetConfig(id=name),
        agent=vf.AgentConfig(harness=spec, runtime={"type": "subprocess"}),
    )
    return vf.SingleAgentEnv(config)
