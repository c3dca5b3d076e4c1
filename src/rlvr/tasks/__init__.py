"""Built-in verifiable tasks that need no download: ``TASKS[name]`` is a ``Task``."""

from rlvr.tasks.arithmetic import ArithmeticTask
from rlvr.tasks.base import Example, Split, Task, extract_answer, format_ok
from rlvr.tasks.calc import CalcTask
from rlvr.tasks.chain import ChainTask
from rlvr.tasks.sort import SortTask

TASKS: dict[str, Task] = {
    task.name: task for task in (ArithmeticTask(), ChainTask(), SortTask(), CalcTask())
}

__all__ = [
    "TASKS",
    "ArithmeticTask",
    "CalcTask",
    "ChainTask",
    "Example",
    "SortTask",
    "Split",
    "Task",
    "extract_answer",
    "format_ok",
]
