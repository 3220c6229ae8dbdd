"""The ASGI app OpenEnv's launchers serve (`uvicorn server.app:app`): tbhpc.openenv.server.app_from_env."""
from tbhpc.openenv.server import app_from_env

app = app_from_env()
