"""Model-based rewards: a sequence-classification reward model and a generative judge.

DeepSeek-R1 uses neural rewards only on general (non-reasoning) data: a verifiable task
should keep its rule-based accuracy reward. Both load lazily on first call (a model instance
or a local path / Hub name), run under `torch.no_grad()` in batches on `device`, and leave the
policy alone.
"""

from __future__ import annotations

import re

import torch

from rlvr.rewards.combine import completion_text, prompt_text


def _load(model, tokenizer, auto_cls, device, dtype):
    from transformers import AutoTokenizer

    if isinstance(model, str):
        import rlvr.rm.verifier  # noqa: F401  (registers `rlvr rm`'s rm.arch=surprise)

        tok = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(model)
        kwargs = {"dtype": getattr(torch, dtype)} if isinstance(dtype, str) else {}
        model = getattr(__import__("transformers"), auto_cls).from_pretrained(model, **kwargs)
    else:
        if tokenizer is None:
            raise ValueError("a model object needs its tokenizer")
        tok = tokenizer
    if isinstance(tok, str):
        tok = AutoTokenizer.from_pretrained(tok)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tok.pad_token_id
    return model.to(device).eval(), tok


def make_reward_model_reward(
    *,
    model=None,
    tokenizer=None,
    device: str = "cpu",
    batch_size: int = 8,
    max_length: int = 4096,
    dtype: str | None = None,
):
    """Reward = logit 0 of an AutoModelForSequenceClassification on prompt + completion
    (the prompt as the trainer rendered it, `prompt_texts`, chat template included; called
    without it, string prompts are joined to the completion and chat prompts go through the
    reward model's chat template, as TRL does), truncated from the left to `max_length`
    tokens so the response end is always scored."""
    if model is None:
        raise ValueError("reward_model needs `model` (a path, a Hub name or a model object)")
    if batch_size < 1:
        raise ValueError(f"reward_model: batch_size must be >= 1, got {batch_size}")
    state: dict = {}

    def reward_model(completions, prompts=None, prompt_texts=None, **kwargs) -> list[float | None]:
        if not state:
            state["model"], state["tok"] = _load(
                model, tokenizer, "AutoModelForSequenceClassification", device, dtype
            )
        m, tok = state["model"], state["tok"]
        texts = [
            _joined(tok, p, c) for p, c in zip(prompt_texts or prompts, completions, strict=True)
        ]
        side = tok.truncation_side
        tok.truncation_side = "left"
        out: list[float | None] = []
        try:
            for i in range(0, len(texts), batch_size):
                batch = tok(
                    texts[i : i + batch_size],
                    return_tensors="pt",
                    padding=True,
                    truncation=True,
                    max_length=max_length,
                    add_special_tokens=False,
                ).to(m.device)
                with torch.no_grad():
                    logits = m(**batch).logits  # (b, num_labels)
                out += [float(x) for x in logits[:, 0].float().cpu()]
        finally:
            tok.truncation_side = side
        return out

    return reward_model


def _joined(tok, prompt, completion) -> str:
    if isinstance(prompt, str):
        return prompt + completion_text(completion)
    messages = list(prompt) + (
        list(completion)
        if isinstance(completion, list)
        else [{"role": "assistant", "content": completion}]
    )
    return tok.apply_chat_template(messages, tokenize=False)


JUDGE_TEMPLATE = (
    "You are grading an answer to a question against the reference answer.\n"
    "Question:\n{question}\n\nReference answer:\n{reference}\n\nResponse:\n{response}\n\n"
    "Is the response's final answer equivalent to the reference answer? "
    "Reply with one word, CORRECT or INCORRECT.\nVerdict:"
)
_VERDICT = re.compile(r"\b(INCORRECT|CORRECT|WRONG|RIGHT|YES|NO)\b", re.IGNORECASE)
_POSITIVE = {"correct", "right", "yes"}


def parse_verdict(text: str) -> float | None:
    """1.0 / 0.0 from the first verdict word in `text` (CORRECT/INCORRECT, RIGHT/WRONG,
    YES/NO, any case); None when there is none."""
    m = _VERDICT.search(text)
    if m is None:
        return None
    return 1.0 if m.group(1).lower() in _POSITIVE else 0.0


def make_judge_reward(
    *,
    model=None,
    tokenizer=None,
    device: str = "cpu",
    batch_size: int = 8,
    max_new_tokens: int = 8,
    template: str = JUDGE_TEMPLATE,
    question_field: str | None = None,
    dtype: str | None = None,
):
    """Generative judge: a causal LM sees the question, the reference answer and the response
    (`template` with {question}, {reference}, {response}); greedy decoding of up to
    `max_new_tokens`; the verdict is parsed by `parse_verdict` (None when unparseable).
    The question is the dataset column `question_field` if given, else the prompt (a chat
    prompt's last user message); the reference is `answer`. The
    judge prompt goes through the judge's chat template when it has one."""
    if model is None:
        raise ValueError("judge needs `model` (a path, a Hub name or a model object)")
    for key in ("{question}", "{reference}", "{response}"):
        if key not in template:
            raise ValueError(f"judge template must contain {key}")
    state: dict = {}

    def judge(completions, answer, prompts=None, **kwargs) -> list[float | None]:
        if not state:
            state["model"], state["tok"] = _load(
                model, tokenizer, "AutoModelForCausalLM", device, dtype
            )
        m, tok = state["model"], state["tok"]
        questions = kwargs[question_field] if question_field else prompts
        texts = []
        for q, ref, resp in zip(questions, answer, completions, strict=True):
            text = template.format(
                question=prompt_text(q), reference=ref, response=completion_text(resp)
            )
            if getattr(tok, "chat_template", None):
                text = tok.apply_chat_template(
                    [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
                )
            texts.append(text)
        side = tok.padding_side
        tok.padding_side = "left"  # generation continues from the last real token
        out: list[float | None] = []
        try:
            for i in range(0, len(texts), batch_size):
                batch = tok(texts[i : i + batch_size], return_tensors="pt", padding=True).to(
                    m.device
                )
                with torch.no_grad():
                    gen = m.generate(
                        **batch,
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        pad_token_id=tok.pad_token_id,
                    )
                new = gen[:, batch["input_ids"].shape[1] :]
                out += [parse_verdict(t) for t in tok.batch_decode(new, skip_special_tokens=True)]
        finally:
            tok.padding_side = side
        return out

    return judge
