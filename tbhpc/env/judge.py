"""Yes/no judges for `rubrics_yesno`: an LLM judge (OpenAI-compatible) and an offline keyword judge.

Why two: the benchmark asks an LLM "does the final message do X?"; offline runs have no LLM, so a
rubric may carry `keywords` and the keyword judge answers yes when any appears. A rubric without
keywords cannot be answered offline: that is a system error (configure an LLM judge), never a 0.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Protocol

from tbhpc.errors import InfraError
from tbhpc.llm_client import ChatEndpoint, Usage
from tbhpc.tasks.schema import Rubric

JUDGE_SYSTEM_PROMPT = ("You are a strict grader. Read the agent's message and answer the question about it. "
                       "Answer with a single word: Yes or No.")


class Judge(Protocol):
    name: str

    def answer(self, rubric: Rubric, final_message: str) -> tuple[bool, Usage]: ...


@dataclass
class KeywordJudge:
    name: str = "keyword"

    def answer(self, rubric: Rubric, final_message: str) -> tuple[bool, Usage]:
        if not rubric.keywords:
            raise InfraError(f"rubric {rubric.question[:60]!r} has no keywords: the keyword judge cannot "
                             "answer it; use an LLM judge (--judge openai)")
        low = " ".join(final_message.lower().split())
        return any(k.lower() in low for k in rubric.keywords), Usage()


@dataclass
class LLMJudge:
    endpoint: ChatEndpoint
    name: str = "llm"

    def answer(self, rubric: Rubric, final_message: str) -> tuple[bool, Usage]:
        prompt = f"<message>{html.escape(final_message, quote=False)}</message>\n\nQuestion: {rubric.question}"
        msg, usage = self.endpoint.chat(
            [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": prompt}],
            temperature=0, max_tokens=128, seed=42)
        return parse_yes(msg.get("content") or ""), usage


def parse_yes(text: str) -> bool:
    """Yes when the first or last word (punctuation stripped) is 'yes'."""
    words = [w for w in re.split(r"\s+", re.sub(r"[^\w\s]", " ", text.lower())) if w]
    return bool(words) and (words[0] == "yes" or words[-1] == "yes")
