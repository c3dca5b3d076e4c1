"""`rlvr export`: a run's model (its newest intact checkpoint) or a checkpoint as a plain
Hugging Face model directory; a LoRA adapter is merged into its base with `--merge`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlvr.config.schema import ConfigError
from rlvr.run.manifest import CheckpointError

SUMMARY = "a run's model as a plain Hugging Face model (--merge folds in LoRA)"


def run(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rlvr export",
        description="Write a plain Hugging Face model from a run directory or a checkpoint; "
        "a LoRA adapter is merged into its base (--merge).",
    )
    p.add_argument("source", help="run directory (newest good checkpoint) or checkpoint directory")
    p.add_argument("--output", required=True, help="directory to write the model to")
    p.add_argument("--merge", action="store_true", help="merge a LoRA adapter into its base")
    args = p.parse_args(argv)
    from rlvr.run.checkpoint import latest_good_checkpoint, verify_checkpoint
    from rlvr.training.policy import export_merged

    source = Path(args.source)
    if (source / "config.yaml").is_file() and (source / "checkpoints").is_dir():
        ckpt = latest_good_checkpoint(source)
        if ckpt is None:
            raise CheckpointError(f"{source}: no intact checkpoint to export")
    else:
        ckpt = source
        verify_checkpoint(ckpt)
    adapter = ckpt / "adapter_config.json"
    if adapter.is_file():
        if not args.merge:
            raise ConfigError(f"{ckpt} holds a LoRA adapter: pass --merge to fold it into its base")
        base = json.loads(adapter.read_text())["base_model_name_or_path"]
        export_merged(ckpt, base, Path(args.output))
    else:
        if args.merge:
            sys.stderr.write(
                f"note: {ckpt} holds a whole model, no LoRA adapter: --merge has nothing to "
                "fold in; writing the model as it is\n"
            )
        from rlvr.models import load_model, load_tokenizer

        load_model(str(ckpt)).save_pretrained(args.output)
        load_tokenizer(str(ckpt)).save_pretrained(args.output)
    print(f"wrote {args.output}")
    return 0
