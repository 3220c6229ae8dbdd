"""Build the simulated user and the judge from command-line flags (shared by every command
that runs episodes)."""
from __future__ import annotations

from tbhpc.env.judge import KeywordJudge, LLMJudge
from tbhpc.env.users import LLMUser, ScriptedUser
from tbhpc.errors import UserError
from tbhpc.llm_client import ChatEndpoint


def build_user(args):
    if getattr(args, "user", "scripted") == "scripted":
        return ScriptedUser()
    if not args.user_url:
        raise UserError("--user openai needs --user-url (an OpenAI-compatible base URL ending in /v1)")
    return LLMUser(ChatEndpoint(args.user_url, args.user_model))


def build_judge(args):
    if getattr(args, "judge", "keyword") == "keyword":
        return KeywordJudge()
    if not args.judge_url:
        raise UserError("--judge openai needs --judge-url (an OpenAI-compatible base URL ending in /v1)")
    return LLMJudge(ChatEndpoint(args.judge_url, args.judge_model))
