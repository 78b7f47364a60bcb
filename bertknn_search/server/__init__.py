"""``bertknn-search serve``: an HTTP API and a web page over a live index (FastAPI on uvicorn).

app (routes), batcher (one model thread, micro-batches), writer (serialised adds and deletes), schemas
(request bodies), limits (body size), run (uvicorn, binding, shutdown), client (``query --server``),
wire (what client and server share, standard library only), discovery (``serving.json`` beside the
index), static/ (the page at ``/``).
"""
