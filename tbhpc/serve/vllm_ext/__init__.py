"""Code that runs inside the vLLM server process (its own environment): stdlib + what vLLM ships."""
