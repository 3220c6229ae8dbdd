"""Build the simulated user and the judge from command-line flags (shared by every command
that runs episodes), and check before any attempt runs that the judge can answer the tasks'
yes/no rubrics (a rubric the keyword judge cannot answer would be a system error on every
attempt and every re-run: a campaign that can never finish)."""
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


def unanswerable_rubrics(tasks, judge: str) -> list[str]:
    """Ids of the tasks with a yes/no rubric that `judge` cannot answer (keyword judge: no keywords)."""
    if judge != "keyword":
        return []
    return [t.id for t in tasks if any(not r.keywords for r in t.rubrics_yesno)]


def check_judge(tasks, judge: str, rubrics: str = "judge", skip_field: bool = True) -> None:
    """Refuse, in one line, a task list whose rubrics the configured judge cannot answer."""
    ids = [] if rubrics == "skip" else unanswerable_rubrics(tasks, judge)
    if ids:
        skip = ", or rubrics=skip (graded on the database only; attempts record rubrics_skipped)" if skip_field else ""
        raise UserError(f"{len(ids)} task(s) carry yes/no rubrics the keyword judge cannot answer (no keywords; first: "
                        f"{ids[0]}): give an LLM judge (judge=openai judge_url=URL), a task list without them{skip}")
