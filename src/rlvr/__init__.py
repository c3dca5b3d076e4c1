"""rlvr: reinforcement learning from verifiable rewards (GRPO, DAPO and neighbours)."""

__version__ = "0.1.0"
