"""Running vLLM engines: the scoring backend (backend.py) and its worker-side hook."""
