"""Prompt data: dataset files (`dataset`: jsonl, json, parquet, local Hugging Face datasets, in
a known format or with named columns), a file's text as UTF-8 and JSON (`text`), the code
benchmarks' formats (`code`), a run's prompts rendered and tokenized once (`prompts`), the bound that refuses a prompt too long for the
context from its length alone (`token_bound`) and the one error a bad row raises (`errors`).

The package re-exports what users import: `from rlvr.data import load_prompt_dataset`.
"""

from rlvr.data.dataset import PromptExample, build_messages, load_prompt_dataset, render_prompt
from rlvr.data.errors import DatasetError

__all__ = [
    "DatasetError",
    "PromptExample",
    "build_messages",
    "load_prompt_dataset",
    "render_prompt",
]
