"""The `hf` policy: a local transformers checkpoint generating in process.

Why: small runs and CPU machines need a policy without a server. Loading is the real loading
code (`from_pretrained` on a directory, or on a GGUF file via `gguf_file=`), so a user's own
checkpoint loads the same way as the tiny models the tests build. torch and transformers are
imported lazily: the rest of tbhpc works without them. Sampling is a `Sampling` (its fields are
options too; the tokens per turn is `max_new_tokens`, 512 unless given).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tbhpc.errors import UserError
from tbhpc.llm_client import Usage
from tbhpc.env.agent import Completion
from tbhpc.policy.sampling import Sampling, flat_sampling
from tbhpc.tasks.schema import Task


def model_dir_problem(path: str, gguf_file: str | None = None) -> str | None:
    """What is wrong with a model path, in words, or None: a directory transformers can load
    (config.json), or a folder with the named GGUF file. Checked before anything loads, so a
    wrong path is one line naming it, not a tokenizer traceback from deep inside transformers."""
    where = Path(path) if path else None
    if where is None or not where.exists():
        return f"{path!r} does not exist"
    if gguf_file:
        return None if (where / gguf_file).is_file() else f"{path!r} holds no GGUF file {gguf_file!r}"
    if not where.is_dir() or not (where / "config.json").is_file():
        return f"{path!r} is not a model directory (no config.json)"
    return None


def from_pretrained(loader: Any, path: str, who: str, **kw: Any) -> Any:
    """`loader.from_pretrained(path)`, a model directory transformers cannot read being the
    user's input (a missing tokenizer file, a config of another library): one line naming it."""
    try:
        return loader.from_pretrained(path, **kw)
    except (OSError, ValueError) as exc:
        why = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise UserError(f"{who}: cannot load {loader.__name__} from model_path {path!r}: {why}") from None


@flat_sampling(max_tokens="max_new_tokens")
@dataclass
class HFPolicy:
    model_path: str = ""                # a transformers checkpoint directory (or the folder of gguf_file)
    gguf_file: str | None = None        # a GGUF file in model_path, loaded (dequantised) instead
    sampling: Sampling = field(default_factory=lambda: Sampling(max_tokens=512))
    seed: int = 0                       # sampling seed (combined with each attempt's)
    threads: int = 1                    # torch threads
    name: str = "hf"
    _loaded: tuple = field(default=(), repr=False)

    @staticmethod
    def check_ready(options: dict) -> None:
        """The model is there (checked before a campaign writes anything)."""
        if (problem := model_dir_problem(options.get("model_path", ""), options.get("gguf_file"))):
            raise UserError(f"--policy hf: model_path {problem}")

    def _load(self) -> tuple[Any, Any]:
        if self._loaded:
            return self._loaded
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise UserError(f"--policy hf needs torch and transformers ({exc}); run `make env`") from None
        if (problem := model_dir_problem(self.model_path, self.gguf_file)):
            raise UserError(f"--policy hf: model_path {problem}")
        torch.set_num_threads(self.threads)
        kw = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        tok = from_pretrained(AutoTokenizer, self.model_path, "--policy hf", **kw)
        model = from_pretrained(AutoModelForCausalLM, self.model_path, "--policy hf", dtype=torch.float32, **kw)
        model.eval()
        self._loaded = (tok, model)
        return self._loaded

    def session(self, task: Task, seed: int = 0) -> "_HFSession":
        self._load()
        return _HFSession(self, self.seed * 1_000_003 + seed)


@dataclass
class _HFSession:
    policy: HFPolicy
    seed: int

    def complete(self, messages: list[dict], tools: list[dict]) -> Completion:
        import torch

        p = self.policy
        s = p.sampling
        tok, model = p._load()
        ids = tok.apply_chat_template(template_messages(messages), tools=tools or None,
                                      add_generation_prompt=True, return_tensors="pt", return_dict=True)
        input_ids = ids["input_ids"]
        torch.manual_seed(self.seed + int(input_ids.shape[1]))  # reproducible per attempt and context
        with torch.no_grad():
            out = model.generate(
                **ids, do_sample=s.temperature > 0, temperature=s.temperature or None,
                top_k=s.top_k, top_p=s.top_p, max_new_tokens=s.max_tokens,
                pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            )
        new = out[0, input_ids.shape[1]:]
        text = tok.decode(new, skip_special_tokens=True)
        return Completion(text, Usage(input_tokens=int(input_ids.shape[1]), output_tokens=int(new.shape[0])))


def template_messages(messages: list[dict]) -> list[dict]:
    """Chat-template form: tool-call arguments as dicts (templates serialise them)."""
    out = []
    for m in messages:
        m2 = {k: m[k] for k in ("role", "content", "tool_call_id", "name") if k in m}
        if m.get("tool_calls"):
            m2["tool_calls"] = [{
                "type": "function",
                "id": c.get("id"),
                "function": {"name": c["function"]["name"], "arguments": _as_dict(c["function"]["arguments"])},
            } for c in m["tool_calls"]]
        out.append(m2)
    return out


def _as_dict(args: Any) -> Any:
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return {}
    return args
