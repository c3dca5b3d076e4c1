"""The reward model: a Hugging Face `AutoModelForSequenceClassification` with one label (a
scalar head on a causal LM's backbone), so the `reward_model` reward loads its directory:
either the backbone's own classifier class (`rm.arch=classifier`) or `rlvr.rm.verifier`'s,
which also reads the backbone's log-probabilities of the response (`rm.arch=surprise`).

It reads the prompt as the policy continued it (chat template included) followed by the
response, exactly the text the `reward_model` reward joins (`prompt_texts` + completion), cut
from the left to `max_length` tokens so the end of the response is always read; batches are
padded on the right, and the saved tokenizer pads on the right too, so the reward reads the
same logits. It never sees the reference answer.
"""

from __future__ import annotations

from pathlib import Path

import torch

from rlvr.models import load_tokenizer, resolve_model_path
from rlvr.rollout import derive_seed


class RewardModel:
    def __init__(self, model: torch.nn.Module, tokenizer, max_length: int = 512):
        self.model, self.tokenizer, self.max_length = model, tokenizer, max_length
        self.model.eval()  # no dropout: scores are a function of the weights

    @classmethod
    def from_backbone(
        cls,
        name_or_path: str,
        seed: int,
        max_length: int = 512,
        extra_layers: int = 0,
        arch: str = "classifier",
        prompts: list[str] | tuple = (),
    ) -> RewardModel:
        """A new reward model on `name_or_path`'s backbone. `arch="classifier"`: the plain
        last-token classifier, its head (and `extra_layers` new decoder layers on top of the
        backbone's, each starting as the identity: its attention and MLP output projections
        are zero) drawn from `seed` without touching the global RNG; `arch="surprise"`: the
        whole causal LM with the head of `rlvr.rm.verifier` (which starts as the response's
        lowest token log-probability), the response found after the `prompts`' common last
        tokens (`response_marker`)."""
        from transformers import AutoConfig, AutoModelForSequenceClassification

        path = resolve_model_path(name_or_path)
        tok = load_tokenizer(name_or_path)
        if arch == "surprise":
            if extra_layers:
                raise ValueError("rm.extra_layers: only rm.arch=classifier stacks new layers")
            model = _surprise_model(path, response_marker(tok, prompts) if prompts else [])
            return cls(_configured(model, tok), tok, max_length)
        config = AutoConfig.from_pretrained(path, num_labels=1)
        base_layers = config.num_hidden_layers
        config.num_hidden_layers = base_layers + extra_layers
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(seed, "rm-head"))
            model = AutoModelForSequenceClassification.from_pretrained(
                path, config=config, dtype=torch.float32
            )
        if extra_layers:
            _identity_layers(model, name_or_path, range(base_layers, config.num_hidden_layers))
        return cls(_configured(model, tok), tok, max_length)

    @classmethod
    def load(cls, path: str | Path, max_length: int = 512) -> RewardModel:
        from transformers import AutoModelForSequenceClassification

        import rlvr.rm.verifier  # noqa: F401  (registers rm.arch=surprise with the Auto classes)

        path = str(path)
        tok = load_tokenizer(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        if model.config.num_labels != 1:
            raise ValueError(f"{path}: a reward model has one label, this one has "
                             f"{model.config.num_labels}")  # fmt: skip
        return cls(_configured(model, tok), tok, max_length)

    def save(self, path: Path) -> None:
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)

    def _texts(self, prompts: list[str], responses: list[str]) -> list[list[int]]:
        texts = [p + r for p, r in zip(prompts, responses, strict=True)]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"]

    def encode(self, prompts: list[str], responses: list[str]) -> list[list[int]]:
        """Each prompt + response, cut from the left to `max_length` tokens."""
        return [x[-self.max_length :] for x in self._texts(prompts, responses)]

    def encode_with_starts(
        self, prompts: list[str], responses: list[str]
    ) -> tuple[list[list[int]], list[int]]:
        """`encode`'s texts and, per text, the index of its first response token (the
        prompt's token count, less what the left cut removed; 0 when the cut reached the
        response)."""
        n_prompt = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        out, starts = [], []
        for x, p in zip(self._texts(prompts, responses), n_prompt, strict=True):
            cut = max(0, len(x) - self.max_length)
            out.append(x[cut:])
            starts.append(min(max(0, len(p) - cut), len(x) - cut - 1))
        return out, starts

    def _batch(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(x) for x in ids)
        device = next(self.model.parameters()).device
        input_ids = torch.full((len(ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = torch.tensor(x)
            mask[i, : len(x)] = 1
        return input_ids.to(device), mask.to(device)

    def forward(self, ids: list[list[int]]) -> torch.Tensor:
        """(B,) logits of the encoded texts (with grad when enabled): the classifier's own
        readout at each text's last token, what the `reward_model` reward reads."""
        input_ids, mask = self._batch(ids)
        out = self.model(input_ids=input_ids, attention_mask=mask)
        return out.logits[:, 0].float()

    def forward_tokens(self, ids: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, W) logits of the scalar head at every position (the prediction after reading
        tokens 0..t) and the (B, W) attention mask; the last valid position's logit is
        `forward`'s."""
        input_ids, mask = self._batch(ids)
        if hasattr(self.model, "token_logits"):  # rm.arch=surprise
            return self.model.token_logits(input_ids, mask), mask
        backbone = getattr(self.model, self.model.base_model_prefix)
        hidden = backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return self.model.score(hidden).squeeze(-1).float(), mask

    @torch.no_grad()
    def score(self, prompts: list[str], responses: list[str], batch_size: int = 64) -> torch.Tensor:
        """(B,) logits; sigmoid of one is the model's probability that the response is correct."""
        ids = self.encode(prompts, responses)
        out = [self.forward(ids[i : i + batch_size]) for i in range(0, len(ids), batch_size)]
        return torch.cat(out).cpu() if out else torch.zeros(0)


def response_marker(tokenizer, prompts: list[str], limit: int = 16) -> list[int]:
    """The token ids every prompt ends with (at most `limit`: the chat template's assistant
    header, say), where each response starts; [] when the prompts share no last token."""
    ids = tokenizer(list(dict.fromkeys(prompts)), add_special_tokens=False)["input_ids"]
    n = min([len(x) for x in ids] + [limit])
    while n and any(x[-n:] != ids[0][-n:] for x in ids):
        n -= 1
    return list(ids[0][-n:]) if n else []


def _surprise_model(path: str, marker) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from rlvr.rm.verifier import SurpriseRMConfig, SurpriseRMForSequenceClassification

    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    backbone = {k: v for k, v in lm.config.to_dict().items() if k != "_name_or_path"}
    config = SurpriseRMConfig(backbone=backbone, response_marker=marker)
    return SurpriseRMForSequenceClassification(config, lm=lm)


def _identity_layers(model: torch.nn.Module, name: str, indices: range) -> None:
    """Zero the output projections of the new layers (Llama-family names), so each adds
    nothing to the residual stream until it trains."""
    layers = getattr(getattr(model, model.base_model_prefix), "layers", None)
    for i in indices:
        layer = layers[i] if layers is not None else None
        outs = [getattr(getattr(layer, a, None), b, None)
                for a, b in (("self_attn", "o_proj"), ("mlp", "down_proj"))]  # fmt: skip
        if any(o is None for o in outs):
            raise ValueError(f"rm.extra_layers: {name} has no Llama-style decoder layers "
                             "(self_attn.o_proj, mlp.down_proj) to extend")  # fmt: skip
        with torch.no_grad():
            for o in outs:
                o.weight.zero_()
                if o.bias is not None:
                    o.bias.zero_()


def _configured(model: torch.nn.Module, tok) -> torch.nn.Module:
    """The classifier finds each row's last token by the pad id: it must be set."""
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.config.pad_token_id = tok.pad_token_id
    tok.padding_side = "right"
    tok.truncation_side = "left"
    return model
