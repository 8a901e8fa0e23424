"""Serving the project's engines over HTTP (`python -m jaxrl_async.serve`, docs/design.md §6).

`client.py` is the engine-facing half and needs no HTTP: many concurrent callers over one
`GenerationEngine`, so the runtime can reuse it. `sampling.py`, `tokens.py` and `chat.py` turn
the wire JSON of vLLM's token-in/token-out route and of OpenAI's chat completions into engine
requests and back, without HTTP either; `app.py` is the FastAPI app over them (FastAPI and
uvicorn are the optional `serve` extra, imported only there).
"""
