"""One training step and the loop: trainer, collect, batch, update, policy, evaluation.

`rlvr.train` is also the Python API's entry point: the package is callable, and
`rlvr.train(model=..., reward_funcs=..., train_dataset=..., ...)` runs `rlvr.api.train` (same
arguments, same `TrainResult`). Its submodules import as usual (`rlvr.train.trainer`, ...).
"""

from __future__ import annotations

import inspect
import sys
import types


class _CallableModule(types.ModuleType):
    """This package's module type: calling it calls `rlvr.api.train`."""

    def __call__(self, *args, **kwargs):
        from rlvr.api import train

        return train(*args, **kwargs)


def _document() -> None:
    from rlvr.api import train

    sig = inspect.signature(train)
    own = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    _CallableModule.__call__.__signature__ = sig.replace(parameters=[own, *sig.parameters.values()])
    _CallableModule.__call__.__doc__ = train.__doc__


sys.modules[__name__].__class__ = _CallableModule
_document()
