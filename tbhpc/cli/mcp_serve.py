"""`tbhpc mcp-serve --domain NAME`: a built-in domain as a stdio MCP tool server with ThinkingBox's
reserved tools, so the reference harness (or `pack=tb:DIR`) can run tbhpc's tasks."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("mcp-serve", help="serve a built-in domain as a stdio MCP tool server (ThinkingBox reserved tools)")
    p.set_defaults(func=run)
    p.add_argument("--domain", required=True, help="retail | insurance | travel | neobank | consulting")


def run(args) -> int:
    from tbhpc.domains import DOMAIN_NAMES
    from tbhpc.errors import UserError
    if args.domain not in DOMAIN_NAMES:
        raise UserError(f"--domain: unknown domain {args.domain!r} (known: {', '.join(DOMAIN_NAMES)})")
    from tbhpc.env.registry import require_mcp
    from tbhpc.mcp.serve import serve
    require_mcp()
    serve(args.domain)
    return 0
