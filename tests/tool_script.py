"""A scripted tiny model for the tool-rollout tests: a real 2-layer Llama, trained here for a
few dozen Adam steps until greedy decoding reproduces two fixed conversations exactly:

- prompt A: two `calc` calls (12*34, then 408+5, each answered by the real `calc` tool),
  then `<answer>413</answer>` and EOS;
- prompt B: `<answer>5</answer>` and EOS, no tool.

The conversations are built with the `Toolbox`'s own tool turns, so the model learns to
continue after exactly the ids an engine appends.
"""

from __future__ import annotations

import json

import torch

from rlvr.models import build_tiny_model
from rlvr.tools import Toolbox


def call(expression: str) -> str:
    args = json.dumps({"name": "calc", "arguments": {"expression": expression}})
    return f"<tool_call>{args}</tool_call>"


def script(tokenizer, toolbox: Toolbox) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, completion ids) of the two conversations."""

    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def prompt(question: str) -> list[int]:
        return enc(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
            )
        )

    a = (
        enc(call("12*34"))
        + toolbox.reply_ids("408")
        + enc(call("408+5"))
        + toolbox.reply_ids("413")
        + enc("<answer>413</answer><|im_end|>")
    )
    return [
        (prompt("Compute 12*34+5."), a),
        (prompt("Compute 2+3."), enc("<answer>5</answer><|im_end|>")),
    ]


def scripted_model(tokenizer, toolbox: Toolbox, max_steps: int = 300, hidden_size: int = 48):
    """The tiny model trained until every scripted token is the argmax by a margin of 2
    (about 90 steps, 3 s on one thread; two threads on a busy machine take far longer).
    `hidden_size`: 2 heads of half of it (vLLM's CPU attention takes heads of 32, not 24)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(tokenizer, toolbox, max_steps, hidden_size)
    finally:
        torch.set_num_threads(threads)


def _train(tokenizer, toolbox: Toolbox, max_steps: int, hidden_size: int = 48):
    return fit(tokenizer, script(tokenizer, toolbox), max_steps, hidden_size)


def fit(tokenizer, seqs, max_steps: int = 300, hidden_size: int = 48, margin_to: float = 2.0):
    """A 2-layer model trained until greedy decoding writes each (prompt ids, completion
    ids) of `seqs`: every completion token the argmax by `margin_to`."""
    model = build_tiny_model(
        tokenizer,
        seed=0,
        hidden_size=hidden_size,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=96,
        max_position_embeddings=512,
    )
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(max_steps):
        loss, margin = 0.0, float("inf")
        for p, c in seqs:
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
            target = torch.tensor(c)
            loss = loss + torch.nn.functional.cross_entropy(logits, target)
            right = logits.gather(1, target[:, None]).squeeze(1)
            other = logits.scatter(1, target[:, None], float("-inf")).max(1).values
            margin = min(margin, float((right - other).min().detach()))
        if margin > margin_to:
            return model.eval()
        opt.zero_grad()
        loss.backward()
        opt.step()
    raise AssertionError(f"the scripted model did not learn its script (margin {margin:.2f})")
