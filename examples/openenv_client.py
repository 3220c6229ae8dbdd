"""Drive `tbhpc openenv-serve` with OpenEnv's own client: one attempt of a retail task, by hand.

    .venv-openenv/bin/tbhpc openenv-serve default --port 8000 &
    .venv-openenv/bin/python examples/openenv_client.py http://127.0.0.1:8000
"""
import sys

from openenv.core.mcp_client import MCPToolClient

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
with MCPToolClient(base_url=url).sync() as env:
    first = env.reset(task_id="retail-order_status-000")
    print("customer:", first.observation.message)
    print("tools:", ", ".join(t.name for t in env.list_tools()))
    print("find_customer_by_email ->", env.call_tool("find_customer_by_email", email="elena.garcia25@example.com")["result"])
    print("get_order ->", env.call_tool("get_order", order_id="O2001")["result"][:120])
    print("customer:", env.call_tool("submit_message", text="Shall I look up anything else?")["result"]["reply"])
    verdict = env.call_tool("finish", message="Your order O2001 has shipped; the tracking number is 1Z5595687015. <DONE>")
    print("reward:", verdict["reward"], verdict["metadata"]["reward_type"],
          "final state == golden state:", verdict["result"]["grade"]["state_match"])
