"""A user reward function file, loaded by path in the end-to-end tests (TRL's signature)."""


def digit_share(completions, **kwargs):
    """Share of digits in the completion: varies even for a random model's outputs."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def has_digit(completions, **kwargs):
    """An accuracy a random model sometimes meets: groups come out mixed, so dynamic sampling
    keeps some and drops others."""
    return [1.0 if any(ch.isdigit() for ch in c) else 0.0 for c in completions]


def picky_digit(completions, **kwargs):
    """`has_digit` that raises on any completion containing "!" (to test failure counting)."""
    if any("!" in c for c in completions):
        raise ValueError("cannot score an exclamation")
    return has_digit(completions)
