"""A reward model that reads its backbone's surprise at the response (`rm.arch=surprise`).

A last-token classifier on the policy's backbone has to recompute the task to judge an
answer; the backbone's language-model head already says which tokens it would not have
written. On the built-in model 91% of the wrong answers state a wrong step (`8-2=4`), and the
lowest log-probability the backbone gives a response's tokens ranks held-out responses at AUC
0.946 against the rule, where the last-token classifier stays near 0.62 (docs/iterative_rl.md).
This model keeps the classifier's head and adds that evidence:

    r(x) = w . h_T  +  a . [min_t log p(y_t | y_<t), mean_t log p(y_t | y_<t)]  +  b

h_T is the backbone's last hidden state at the text's last token; t runs over the response's
tokens, found after the last occurrence of `response_marker` (the token ids every training
prompt ends with, e.g. the chat template's assistant header; the whole text after its first
token when the marker is empty or absent); p is the backbone's own language-model head, trained
with the rest. It starts as a = (1, 0), b = 0, w = 0: the backbone's lowest token
log-probability, which training then calibrates and extends.

The same readout at every position t (the features over the response up to t) is what
`token_bce` / `prefix_bce` train; at the last token it is the score.

This file imports only torch and transformers: `save_pretrained` copies it beside the weights
with an `auto_map`, so `AutoModelForSequenceClassification.from_pretrained(dir,
trust_remote_code=True)` loads the model without rlvr; importing this module (rlvr does,
before loading any reward model) registers the architecture so no flag is needed.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import SequenceClassifierOutput

FEATURES = ("min_logprob", "mean_logprob")
LOGIT_ROWS = 1024  # positions x batch rows whose vocabulary logits exist at one time


class SurpriseRMConfig(PretrainedConfig):
    """`backbone`: the causal LM's config as a dict; `response_marker`: token ids."""

    model_type = "rlvr_surprise_rm"

    def __init__(self, backbone: dict | None = None, response_marker=(), **kwargs):
        self.backbone = dict(backbone or {})
        self.response_marker = [int(t) for t in response_marker]
        kwargs["num_labels"] = 1
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)


class SurpriseRMForSequenceClassification(PreTrainedModel):
    config_class = SurpriseRMConfig
    base_model_prefix = "lm"

    def __init__(self, config: SurpriseRMConfig, lm: PreTrainedModel | None = None):
        """`lm`: the loaded causal LM to wrap (its config is `config.backbone`); none (as
        `from_pretrained` calls it): one built from `config.backbone`, weights loaded after."""
        super().__init__(config)
        if lm is None:
            backbone = dict(config.backbone)
            lm = AutoModelForCausalLM.from_config(
                AutoConfig.for_model(backbone.pop("model_type"), **backbone)
            )
        self.lm = lm
        self.score = nn.Linear(self.lm.config.hidden_size, 1, bias=False)
        self.surprise = nn.Linear(len(FEATURES), 1)
        self.post_init()
        self.start_as_surprise()

    def start_as_surprise(self) -> None:
        """w = 0, a = (1, 0), b = 0: the score is the response's lowest token log-prob."""
        with torch.no_grad():
            self.score.weight.zero_()
            self.surprise.weight.zero_()
            self.surprise.weight[0, 0] = 1.0
            self.surprise.bias.zero_()

    def _init_weights(self, module):  # the backbone's weights come from its own checkpoint
        pass

    def get_input_embeddings(self):
        return self.lm.get_input_embeddings()

    def response_starts(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """(B,) index of each row's first response token: just after the last occurrence of
        the marker among its valid tokens, else 1."""
        B, W = input_ids.shape
        marker = torch.tensor(self.config.response_marker, device=input_ids.device)
        m = len(marker)
        if m == 0 or m > W:
            return torch.ones(B, dtype=torch.long, device=input_ids.device)
        windows = input_ids.unfold(1, m, 1)  # (B, W - m + 1, m)
        hit = (windows == marker).all(-1) & mask[:, m - 1 :].bool()
        ends = torch.arange(m, W + 1, device=input_ids.device)  # the token after each window
        found = (hit * ends[None, :]).amax(1)
        return torch.where(found > 0, found, 1)

    def token_logprobs(self, hidden: torch.Tensor, input_ids: torch.Tensor, first: int):
        """(B, W) log p(x_t | x_<t) for t >= `first` (0 before): the LM head applied to the
        final hidden states a slice of positions at a time, so no (B, W, vocab) tensor is
        held at once (a 150k vocabulary at 8 x 4,096 tokens would be 20 GB in fp32)."""
        B, W = input_ids.shape
        head = self.lm.get_output_embeddings()
        cap = getattr(self.lm.config, "final_logit_softcapping", None)
        lp = torch.zeros((B, W), dtype=torch.float32, device=input_ids.device)
        step = max(1, LOGIT_ROWS // B)
        for c in range(max(first, 1) - 1, W - 1, step):
            logits = head(hidden[:, c : min(c + step, W - 1)]).float()  # tokens c + 1 ...
            if cap:  # Gemma-2's soft cap, as its causal-LM forward applies it
                logits = cap * torch.tanh(logits / cap)
            t = slice(c + 1, c + 1 + logits.shape[1])
            picked = logits.gather(-1, input_ids[:, t, None]).squeeze(-1)
            lp[:, t] = picked - logits.logsumexp(-1)
        return lp

    def token_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """(B, W): the readout after each position, with the features over the response's
        tokens up to it (0 before the response starts)."""
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        backbone = getattr(self.lm, self.lm.base_model_prefix)
        hidden = backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state
        starts = self.response_starts(input_ids, mask)
        lp = self.token_logprobs(hidden, input_ids, int(starts.min()))
        cols = torch.arange(input_ids.shape[1], device=input_ids.device)
        resp = mask.bool() & (cols[None, :] >= starts[:, None])
        n = resp.cumsum(1)
        cummin = lp.masked_fill(~resp, float("inf")).cummin(1).values
        cummin = torch.where(n > 0, cummin, torch.zeros_like(cummin))
        cummean = (lp * resp).cumsum(1) / n.clamp(min=1)
        features = torch.stack([cummin, cummean], -1).to(self.surprise.weight.dtype)
        return self.score(hidden).squeeze(-1).float() + self.surprise(features).squeeze(-1).float()

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        per_token = self.token_logits(input_ids, mask)
        cols = torch.arange(input_ids.shape[1], device=input_ids.device)
        last = (mask.bool() * cols[None, :]).amax(1)  # right or left padding
        logits = per_token[torch.arange(len(last), device=last.device), last][:, None]
        loss = None
        if labels is not None:
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits[:, 0], labels.to(logits.dtype)
            )
        return SequenceClassifierOutput(loss=loss, logits=logits)


AutoConfig.register(SurpriseRMConfig.model_type, SurpriseRMConfig, exist_ok=True)
AutoModelForSequenceClassification.register(
    SurpriseRMConfig, SurpriseRMForSequenceClassification, exist_ok=True
)
SurpriseRMConfig.register_for_auto_class()
SurpriseRMForSequenceClassification.register_for_auto_class("AutoModelForSequenceClassification")
