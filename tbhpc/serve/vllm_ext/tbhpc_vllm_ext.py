"""An HTTP middleware loaded into the vLLM server with `--middleware`: `GET /v1/models` also
reports the weight version the engine serves (`weight_version` on each model card).

Why: clients (and people with curl) confirm a weight sync by asking the standard models route;
vLLM tracks the version (`/update_weight_version`) but does not show it there. This module runs
in the vLLM environment, so it imports only what that environment has (starlette, via vLLM).
"""
from __future__ import annotations

import json


async def report_weight_version(request, call_next):
    response = await call_next(request)
    if request.method != "GET" or request.url.path.rstrip("/") != "/v1/models" or response.status_code != 200:
        return response
    from starlette.responses import JSONResponse

    body = b"".join([chunk async for chunk in response.body_iterator])
    try:
        data = json.loads(body)
        version = await request.app.state.engine_client.get_weight_version()
    except Exception:  # never break the route over a version lookup
        return JSONResponse(json.loads(body or b"{}"), status_code=200)
    for card in data.get("data", []):
        card["weight_version"] = version
    return JSONResponse(data, status_code=200)
