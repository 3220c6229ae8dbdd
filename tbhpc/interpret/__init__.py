"""THE interpreter of model output. Training and evaluation both call `interpret()`; no other
code in tbhpc parses model text.

Why one module: if train-time parsing differs from eval-time parsing, the policy is optimised on
different tool semantics than it is scored on.
"""
from tbhpc.interpret.coerce import coerce_arguments
from tbhpc.interpret.parse import Interpretation, ToolCall, interpret, render_tool_call

__all__ = ["Interpretation", "ToolCall", "interpret", "coerce_arguments", "render_tool_call"]
