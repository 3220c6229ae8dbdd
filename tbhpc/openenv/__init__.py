"""OpenEnv both ways: tbhpc's tasks served as an OpenEnv environment (`server`, which needs the
openenv package: `make env-openenv`), and OpenEnv environments as a tbhpc Environment for
campaigns and training (`remote`, which needs only a WebSocket client)."""
