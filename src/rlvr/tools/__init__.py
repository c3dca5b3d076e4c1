"""Tools the model calls inside a rollout (docs/tools.md): the built-ins (`calc`, `python`),
resolving names, parsing calls, running them, and the `Toolbox` the engines use."""

from rlvr.tools.builtin import BUILTIN_TOOLS, calc, make_python_tool
from rlvr.tools.calls import (
    ParsedCall,
    Tool,
    ToolFormat,
    ToolResult,
    ToolRunner,
    as_tool,
    parse_call,
    resolve_tool,
    resolve_tools,
)
from rlvr.tools.session import Toolbox, ToolReply

__all__ = [
    "BUILTIN_TOOLS",
    "ParsedCall",
    "Tool",
    "ToolFormat",
    "ToolReply",
    "ToolResult",
    "ToolRunner",
    "Toolbox",
    "as_tool",
    "calc",
    "make_python_tool",
    "parse_call",
    "resolve_tool",
    "resolve_tools",
]
