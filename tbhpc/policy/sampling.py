"""How tokens are drawn: one `Sampling` (temperature, top-k, top-p, tokens per turn) that the
generators, the token policy, the in-process HF policy and the trainer share.

Why a module of its own: options and configs spell its fields flat (`--opt temperature=0.7`, a
campaign's `policy_opts: {top_p: 0.9}`, a train config's `temperature:`) while the code holds one
object. `flat_sampling` lets a policy dataclass that holds a `sampling` field take that spelling
too, and `option_fields` is the flat spelling checked like any other field (the same names, types
and messages as if each policy declared the four fields itself). No torch, no HTTP here: the
train config imports it.
"""
from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, fields, replace


@dataclass
class Sampling:
    """The defaults are the published ones."""
    temperature: float = 1.0        # softmax temperature
    top_k: int = 20                 # sample among the k most likely tokens (0: all)
    top_p: float = 0.95             # ... and within this much probability mass
    max_tokens: int = 1024          # per turn


def flat_sampling(**renamed: str):
    """Class decorator for a dataclass with a `sampling: Sampling` field: its constructor also takes
    Sampling's fields as keyword arguments (`renamed` maps a field to the option's other name, as
    `max_tokens="max_new_tokens"`); they override those of `sampling`. The option names are kept in
    the class's `sampling_options` (option -> Sampling field)."""
    def wrap(cls):
        names = {renamed.get(f.name, f.name): f.name for f in fields(Sampling)}
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            flat = {names[k]: kwargs.pop(k) for k in list(kwargs) if k in names}
            init(self, *args, **kwargs)
            if flat:
                self.sampling = replace(self.sampling, **flat)

        cls.__init__ = __init__
        cls.sampling_options = names
        return cls
    return wrap


@functools.cache
def option_fields(cls: type) -> type:
    """The fields of `cls` as its options spell them: a `flat_sampling` class's `sampling` as the
    flat options instead (a stand-in dataclass for checking names and types); any other class as is."""
    names = getattr(cls, "sampling_options", None)
    if not names:
        return cls
    hints, kinds = typing.get_type_hints(cls), typing.get_type_hints(Sampling)
    own = [(f.name, hints[f.name]) for f in fields(cls) if f.name != "sampling"]
    return dataclasses.make_dataclass(cls.__name__, own + [(option, kinds[name]) for option, name in names.items()])
