"""The optional extras (`peft`, `vllm`, `vllm-cpu`, ...) as the command that installs one into
this installation: the extra's own requirements, read from rlvr's installed metadata, so the
hint works the same for a wheel, a source tree or an editable install (`pip install
'rlvr[peft]'` names a distribution that a source checkout never published)."""

from __future__ import annotations

import importlib.metadata
import re

_EXTRA = re.compile(r"""^(?P<req>[^;]+);\s*extra\s*==\s*["'](?P<extra>[\w.-]+)["']\s*$""")


def extra_requirements(extra: str) -> list[str]:
    """The requirements `rlvr[extra]` adds ("peft>=0.12"), [] when rlvr's metadata is absent."""
    try:
        requires = importlib.metadata.requires("rlvr") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for line in requires:
        m = _EXTRA.match(line)
        if m and m["extra"] == extra:
            out.append(m["req"].strip())
    return out


def install_hint(extra: str) -> str:
    """`pip install 'peft>=0.12'`: what gives this installation the extra."""
    reqs = extra_requirements(extra) or [f"rlvr[{extra}]"]
    return "pip install " + " ".join(f"'{r}'" for r in reqs)
