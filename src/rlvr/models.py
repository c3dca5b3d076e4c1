"""Models and tokenizers: any Hugging Face causal LM, and the built-in tiny model.

Everything loads through ``from_pretrained``. The built-in model ``"rlvr-tiny"`` is an
ordinary Hugging Face checkpoint shipped inside the package (``rlvr/assets/rlvr-tiny``);
``resolve_model_path`` turns the name into that directory and nothing downstream knows the
difference. ``scripts/build_tiny_model.py`` rebuilds it from ``build_tokenizer`` and
``build_tiny_model``.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import string
from pathlib import Path
from typing import Literal

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

TINY_MODEL_NAME = "rlvr-tiny"
ASSETS_DIR = Path(__file__).resolve().parent / "assets"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
UNK_TOKEN = "<unk>"
# Not special: they must survive `decode(..., skip_special_tokens=True)` so that rewards
# can see them, as in Qwen3 / DeepSeek-R1 tokenizers.
TAG_TOKENS = ("<think>", "</think>", "<answer>", "</answer>")
# Hermes / Qwen2.5 tool-call tags, also not special (a tool parser must see them); appended
# after the 100 ids above so that ids 0..103 keep their meaning.
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Qwen2.5-style ChatML template, without Qwen's default system prompt. A "tool" message is
# the tool's result wrapped in <tool_response></tool_response>, and an assistant message's
# `tool_calls` are written as the model writes them, <tool_call>{"name": ..., "arguments":
# ...}</tool_call> (an argument string as it is, an object as JSON), as Qwen2.5 renders them.
# A request's `tools` are listed in the system message, where there is one, as Hermes /
# Qwen2.5 list them (`<tools>`, one JSON schema a line); the template adds no system turn of
# its own: the model was trained on its task prompts alone, and any text added to one derails
# it. Of calc's held-out prompts (T=1, the tool in the loop) 90 of 256 are right as trained,
# 0 of 256 with a 29-80 token system turn naming calc before the prompt, 0 of 128 with 14-29
# tokens of it before, inside or after the user's turn; calc's one JSON schema alone is 356
# tokens, more than its 512-token context leaves. So a `tools` request without a system
# message renders the prompt the `calc` task trains on, id for id (71 of 71). Messages
# without these fields render as they always have.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{{- '<|im_start|>tool\\n<tool_response>' + message['content'] + '</tool_response><|im_end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{- '<|im_start|>assistant\\n' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] %}"
    "{%- set fn = call['function'] if call['function'] is defined else call %}"
    "{{- '<tool_call>{\"name\": ' + fn['name'] | tojson + ', \"arguments\": ' }}"
    "{%- if fn['arguments'] is string %}{{- fn['arguments'] }}"
    "{%- else %}{{- fn['arguments'] | tojson }}{%- endif %}"
    "{{- '}</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif loop.first and message['role'] == 'system' and tools %}"
    "{{- '<|im_start|>system\\n' + message['content'] + '\\n\\n<tools>\\n' }}"
    "{%- for tool in tools %}{{- tool | tojson + '\\n' }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# How `tokenizer.parse_response` reads a reply in the format above (transformers' response
# template): `<tool_call>` regions are `tool_calls` (their JSON as {"type": "function",
# "function": {...}}), the rest up to `<|im_end|>` is `content`. No reasoning field: the
# model's `<think>` part belongs to its answer format (`format_ok` reads it in the content).
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close": "</tool_call>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close": "<|im_end|>", "content": "text"},
    },
}

Dtype = Literal["float32", "bfloat16", "float16", "auto"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per printable ASCII character and newline.

    Special tokens (single ids): ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>``
    (eos), ``<unk>``; added non-special tokens: ``<think>``, ``</think>``, ``<answer>``,
    ``</answer>`` (ids 4..7) and ``<tool_call>``, ``</tool_call>``, ``<tool_response>``,
    ``</tool_response>`` (ids 104..107, after the characters). 108 ids, fixed by
    construction, so the vocabulary never depends on data. It carries ``CHAT_TEMPLATE`` and
    ``RESPONSE_TEMPLATE`` (saved with it: ``chat_template.jinja``, and ``response_template`` in
    ``tokenizer_config.json``).
    """
    specials = [PAD_TOKEN, IM_START, EOS_TOKEN, UNK_TOKEN]
    chars = ["\n", *string.printable[:95]]  # digits, letters, punctuation, space
    vocab = {tok: i for i, tok in enumerate([*specials, *TAG_TOKENS, *chars, *TOOL_TOKENS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    tok.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t in (*TAG_TOKENS, *TOOL_TOKENS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        response_template=RESPONSE_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=512,
    )


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    max_position_embeddings: int = 512,
) -> PreTrainedModel:
    """A randomly initialised Llama causal LM sized for ``tokenizer``; same seed, same weights.

    Llama rather than Qwen2: transformers 5 loads any ``model_type="qwen2"`` checkpoint's
    tokenizer as ``Qwen2Tokenizer``, which replaces this tokenizer's character-level
    pre-tokenizer with Qwen's byte-level one; for ``llama`` it honours the saved class.
    """
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids(IM_START),
    )
    with torch.random.fork_rng(devices=[]):  # seeded init, the caller's RNG untouched
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        bos_token_id=config.bos_token_id,
    )
    return model


def resolve_model_path(name_or_path: str) -> str:
    """``"rlvr-tiny"`` -> the shipped checkpoint; a local directory -> itself; else a hub id.

    A string that looks like a filesystem path (absolute, ``./``, ``~``, or an existing
    file) but is not a directory fails here with ``FileNotFoundError`` naming it.
    """
    if name_or_path == TINY_MODEL_NAME:
        path = ASSETS_DIR / TINY_MODEL_NAME
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"the built-in model {TINY_MODEL_NAME!r} is missing from {path}; "
                "rebuild it with `python scripts/build_tiny_model.py`"
            )
        return str(path)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return str(path)
    if _looks_local(name_or_path) or path.exists():
        raise FileNotFoundError(f"model path {name_or_path!r} is not a directory")
    return name_or_path


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..")


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer; one without a pad token gets ``pad = eos``.

    ``pad == eos`` is safe here because response masks are built from lengths, never by
    comparing token ids with ``pad_token_id``.
    """
    path = resolve_model_path(name_or_path)
    # A directory that declares a generic fast tokenizer gets exactly that: AutoTokenizer would
    # swap in the model type's own class (Qwen2Tokenizer for qwen2), which rebuilds the
    # pre-tokenizer and, for a tokenizer made with `tokenizers` like ours, drops spaces.
    load = AutoTokenizer.from_pretrained
    if _declared_tokenizer_class(path) in _GENERIC_TOKENIZERS:
        load = PreTrainedTokenizerFast.from_pretrained
    tokenizer = _from_pretrained(load, path, name_or_path, **hub_kwargs(path))
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {name_or_path!r} has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


_GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _declared_tokenizer_class(path: str) -> str | None:
    config = Path(path) / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("tokenizer_class")
    except (json.JSONDecodeError, AttributeError):
        return None  # let from_pretrained report the broken file


def load_model(
    name_or_path: str, *, dtype: Dtype = "float32", device: str | torch.device = "cpu"
) -> PreTrainedModel:
    """Load a causal LM with ``AutoModelForCausalLM.from_pretrained`` and move it to ``device``."""
    if dtype != "auto" and dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {[*_DTYPES, 'auto']}")
    path = resolve_model_path(name_or_path)
    if Path(path).is_dir() and not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(f"model directory {name_or_path!r} has no config.json")
    torch_dtype = "auto" if dtype == "auto" else _DTYPES[dtype]
    model = _from_pretrained(
        AutoModelForCausalLM.from_pretrained,
        path,
        name_or_path,
        dtype=torch_dtype,
        **hub_kwargs(path),
    )
    return model.to(device)


HUB_PROBE_TIMEOUT_S = 3.0
_hub_state: dict[str, str | None] = {}  # endpoint -> None (it answers) or why it does not


def hub_unreachable() -> str | None:
    """None when the Hugging Face Hub answers, else why not: HF_HUB_OFFLINE, or the error of
    one HEAD request to the endpoint (at most HUB_PROBE_TIMEOUT_S, once per process, through
    the Hub's own HTTP session and so its proxy settings). Without it, an unreachable Hub
    costs each id transformers' retries (about 47 s measured) before the error."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    endpoint = constants.ENDPOINT
    if endpoint not in _hub_state:
        try:
            get_session().head(endpoint, timeout=HUB_PROBE_TIMEOUT_S)
            _hub_state[endpoint] = None
        except Exception as e:  # httpx's connect, timeout and proxy errors
            _hub_state[endpoint] = f"{endpoint}: {type(e).__name__}: {e}"
    return _hub_state[endpoint]


def hub_kwargs(path: str) -> dict:
    """`from_pretrained`'s extra keyword arguments for `path`: none for a local directory or
    a reachable Hub; `local_files_only` for a Hub id in the local cache when the Hub cannot
    be reached; FileNotFoundError in one line when it is neither."""
    if Path(path).is_dir():
        return {}
    why = hub_unreachable()
    if why is None:
        return {}
    from huggingface_hub import constants, try_to_load_from_cache

    cached = False
    for filename in ("config.json", "tokenizer_config.json"):
        with contextlib.suppress(ValueError):  # not a valid repo id: not cached
            cached = cached or isinstance(try_to_load_from_cache(path, filename), str)
    if cached:
        return {"local_files_only": True}
    raise FileNotFoundError(
        f"could not load {path!r}: it is not a local directory, the Hugging Face Hub cannot "
        f"be reached from here ({why}) and the local cache ({constants.HF_HUB_CACHE}) does "
        f"not hold it; pass a local model directory, or `hf download {path}` where there is "
        "a network"
    )


def check_vocabulary(tokenizer, model: torch.nn.Module, name: str) -> None:
    """ValueError in one line when the tokenizer makes ids the model cannot embed. An
    embedding larger than the tokenizer is normal (Qwen2 pads its 151,665 ids to 151,936
    rows); only ids at or past the embedding's rows are an error."""
    embedding = unwrap_model(model).get_input_embeddings()
    rows = getattr(embedding, "num_embeddings", None)
    ids = len(tokenizer)
    if rows is not None and ids > rows:
        raise ValueError(
            f"{name}: the tokenizer makes {ids:,} token ids but the model embeds only {rows:,} "
            f"(ids {rows:,}..{ids - 1:,} have no embedding); pass the model's own tokenizer "
            "or resize the model's embeddings (model.resize_token_embeddings(len(tokenizer)))"
        )


def _from_pretrained(load, path: str, name: str, **kwargs):
    """Call a ``from_pretrained``; turn transformers' OSError into one naming the model."""
    try:
        return load(path, **kwargs)
    except OSError as err:
        raise FileNotFoundError(
            f"could not load {name!r}: it is neither a local model directory nor a Hugging "
            f"Face Hub id that can be reached from here ({type(err).__name__}: {err})"
        ) from err


@contextlib.contextmanager
def progress_bars(enabled: bool):
    """Inside: transformers' and the Hub's progress bars (loading weights, writing shards,
    downloads) on or off as asked; outside: as they were. `--no-progress` sets
    HF_HUB_DISABLE_PROGRESS_BARS for the whole process instead."""
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    was_hf, was_hub = (
        hf_logging.is_progress_bar_enabled(),
        not hub_utils.are_progress_bars_disabled(),
    )
    if not enabled:
        hf_logging.disable_progress_bar()
        hub_utils.disable_progress_bars()
    try:
        yield
    finally:
        if was_hf:
            hf_logging.enable_progress_bar()
        if was_hub:
            hub_utils.enable_progress_bars()


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model under DDP (`.module`) and PEFT (`get_base_model()`) wrappers."""
    for _ in range(8):
        inner = getattr(model, "module", None)
        if inner is None and hasattr(model, "get_base_model"):
            inner = model.get_base_model()
        if not isinstance(inner, torch.nn.Module) or inner is model:
            break
        model = inner
    return model


def eos_ids(tokenizer, model) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (chat models often have
    two, e.g. Qwen2.5's <|im_end|> and <|endoftext|>)."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(model.generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(i for i in ids if i is not None)


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: transformers 5 renamed `past_key_values` to
    `cache` (the old name warns, then goes)."""
    params = inspect.signature(unwrap_model(model).forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def autocast(mode: str, device: str | torch.device) -> contextlib.AbstractContextManager:
    """`model.autocast` as a context: bf16 matmuls over fp32 weights, or nothing for "none"."""
    if mode == "none":
        return contextlib.nullcontext()
    if mode != "bfloat16":
        raise ValueError(f"autocast {mode!r} is not one of none, bfloat16")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)
