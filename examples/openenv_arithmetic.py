"""The built-in arithmetic task as an OpenEnv environment, served on loopback.

An episode is one problem (the reset's `seed` picks it) and at most two tries: the model's
reply is the action's `message`; a right answer scores 1 and ends the episode, a wrong one
scores 0 and the model reads "Wrong, try again." for its second try.

    pip install "rlvr[openenv]"
    python examples/openenv_arithmetic.py --port 8001 &
    rlvr train --env openenv:http://127.0.0.1:8001 --max-steps 20

or let rlvr serve it for the run's length (on a free loopback port):

    rlvr train --env openenv:examples/openenv_arithmetic.py:app --max-steps 20
"""

from __future__ import annotations

import argparse

from openenv.core.env_server import Action, Environment, Observation, State, create_app

from rlvr.tasks import TASKS

TASK = TASKS["arithmetic"]
TRIES = 2


class ArithmeticAction(Action):
    message: str


class ArithmeticObservation(Observation):
    prompt: str


class ArithmeticEnvironment(Environment):
    """One session's episode: its problem and the tries made."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each WebSocket session has an instance of its own

    def __init__(self):
        super().__init__()
        self._state, self.example, self.tries = State(), None, 0

    def reset(self, seed=None, episode_id=None, **kwargs) -> ArithmeticObservation:
        (self.example,) = TASK.make_examples("train", 1, seed=seed or 0)
        self._state, self.tries = State(episode_id=episode_id), 0
        return ArithmeticObservation(prompt=TASK.instruction(self.example))

    def step(self, action: ArithmeticAction, timeout_s=None, **kwargs) -> ArithmeticObservation:
        if self.example is None:
            raise RuntimeError("step before reset")
        self.tries += 1
        self._state.step_count += 1
        right = TASK.verify(action.message, self.example)
        return ArithmeticObservation(
            prompt="Right." if right else "Wrong, try again.",
            reward=float(right),
            done=right or self.tries >= TRIES,
        )

    @property
    def state(self) -> State:
        return self._state


# up to 256 episodes at once: a step's rollouts (prompts x group size) each hold a session
app = create_app(
    ArithmeticEnvironment, ArithmeticAction, ArithmeticObservation, max_concurrent_envs=256
)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
