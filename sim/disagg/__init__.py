"""Prefill/decode disaggregation: a prefill pool and a decode pool of servesim engines in
one SimPy environment, the KV link between them and the hand-over (docs/disaggregation.md).
Engine side: imports only sim/ (no policies, no app)."""
