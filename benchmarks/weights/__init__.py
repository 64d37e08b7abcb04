"""``rlkube bench weights``: train -> eval weight sync, rlkube side by side with its peers.

models.py   state dicts shaped like an MLP (fp32) or a transformer (bf16, fp32 norms)
readers.py  reader processes (rlkube, gloo, raw gRPC) and the Ray reader actor
methods.py  the trainer side of every method, one class each
run.py      the command: matrix, iterations, fingerprint checks, table, --json
"""
