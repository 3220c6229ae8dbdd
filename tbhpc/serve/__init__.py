"""Serve package: the policy server that runs next to the trainer (vLLM on GPU or CPU), its
endpoint file, and the weight-sync protocol between trainer and server.

Why a package of its own: the trainer and the server live in different Python environments
(vLLM pins its own torch/transformers), so everything here that the trainer imports is stdlib-only
and talks to vLLM through a subprocess and HTTP, never through `import vllm`. Kept import-free.
"""
