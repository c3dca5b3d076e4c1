"""Environments that drive rollouts from outside rlvr's own loop: agent functions that reach
the run's policy through an OpenAI-compatible endpoint of the run's own (token ids in and out,
every request recorded), assembled into trajectories of exactly the sampled ids
(docs/environments.md)."""

from rlvr.environments.recorder import AgentFault, Recorder, Turn

__all__ = ["AgentFault", "Recorder", "Turn"]
