"""Upstream instances: OpenAI-compatible servers (vLLM, SGLang, llama.cpp, andante) as
instances of the cluster layer (DESIGN.md §4: "an upstream server is one more kind of
instance behind the same controller").

`metrics` reads an upstream's Prometheus load figures, `discovery` checks the fleet at
start (models, kinds, bad input), `instance` is the `Instance` seam over one upstream,
`proxy` forwards one request's body and streams its answer back, and `fleet` owns the
controllers, the polling and the fault handling.
"""
