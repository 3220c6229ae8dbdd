"""argparse `type=` functions for numbers with a range: a bad value is argparse's one-line error.

Why: `type=int` takes `--bootstrap -5` and `type=float` takes `nan` or `inf`; the command then
failed deep inside (a traceback) or waited forever. Ranges belong where the flag is declared.
"""
from __future__ import annotations

import argparse
import math


def int_in(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer within [{low}, {high if high is not None else 'inf'}], got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def float_in(low: float, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number within [{low:g}, {high:g}], got {text}")
        return value
    parse.__name__ = "number"
    return parse
