"""A stand-in for vLLM in the calibration driver (calibration/vllm_driver.py, request
``"engine": "fake"``), so the driver's protocol, its step planning and a fit of its output
are tested without vLLM.

Owns :class:`FakeEngine`: vLLM V1's scheduling rule as the driver relies on it (running
requests in admission order, then waiting ones, each given min(its remaining tokens, the
budget left); a waiting request starts from the whole cached blocks of its prompt, short
of the last token; a request samples when its computed tokens reach its tokens and stops
at ``max_tokens`` or max_model_len; a prompt of at least max_model_len tokens is
refused), a prefix cache that never evicts, a pool that never runs out (so no
preemption), and step times from known linear costs. It serves the driver's calibration
and replay modes alike. Standard library only, like the driver.
"""

from __future__ import annotations

from typing import Any

FEATURES = ("step", "tokens", "prefill_attention_pairs", "prefill_context_tokens",
            "decode_context_tokens", "seqs", "sampled_seqs", "lm_head")
"""Names of calibration.fit.FEATURES the fake's costs may use (no roofline knot)."""


class FakeEngine:
    """``coefficients`` (seconds per unit of FEATURES) price each step; the thread and
    wall seconds are that price, the phases {"model": price}. Raises ValueError for an
    unknown coefficient name."""

    def __init__(self, request: dict[str, Any]) -> None:
        self.coefs = {k: float(v) for k, v in request["fake"]["coefficients"].items()}
        unknown = set(self.coefs) - set(FEATURES)
        if unknown:
            raise ValueError(f"fake coefficients: unknown {sorted(unknown)}")
        self.max_num_seqs = int(request["max_num_seqs"])
        self.block = int(request.get("block_size") or 16)
        # id -> [tokens, computed, outputs, max_tokens, shared]; keys apart
        self.reqs: dict[str, list[int]] = {}
        self.keys: dict[str, str] = {}
        self.cached: dict[str, int] = {}  # prefix key -> tokens in whole cached blocks
        self.running: list[str] = []
        self.waiting: list[str] = []
        self.max_model_len = int(request["max_model_len"])
        self.scheduled: list[tuple[str, int]] = []
        self.produced: list[tuple[str, int, bool]] = []
        self.preempted: list[str] = []  # the fake's pool never runs out

    def facts(self) -> dict[str, Any]:
        return {"engine": "fake", "vllm_version": None, "torch_version": None,
                "device_name": "fake engine (no model)", "block_size": self.block,
                "startup_s": 0.0}

    def add(self, prompt_len: int, max_tokens: int, prefix: tuple[str, int],
            priority: int = 0) -> str:
        """A request whose first prefix[1] tokens are the sequence prefix[0] (priority is
        ignored: the fake serves in arrival order). Raises ValueError, as vLLM's input
        processor does, for a prompt of at least max_model_len tokens."""
        if prompt_len >= self.max_model_len:
            raise ValueError(f"The decoder prompt (length {prompt_len}) is longer than the "
                             f"maximum model length of {self.max_model_len}.")
        rid = f"r{len(self.reqs)}"
        max_tokens = min(max_tokens, self.max_model_len - prompt_len)  # stops at the limit
        self.reqs[rid] = [prompt_len, 0, 0, max_tokens, prefix[1]]
        self.keys[rid] = prefix[0]
        self.waiting.append(rid)
        return rid

    def abort(self, ids: list[str]) -> None:
        for rid in ids:
            for queue in (self.running, self.waiting):
                if rid in queue:
                    queue.remove(rid)

    def unfinished(self) -> bool:
        return bool(self.running or self.waiting)

    def reset_prefix_cache(self) -> None:
        self.cached.clear()

    def step(self, budget: int) -> tuple[list[tuple[int, int, bool, bool]], float, float,
                                         dict[str, float]]:
        scheduled: list[tuple[str, int]] = []
        for rid in self.running:
            if budget <= 0:
                break
            n = min(self.reqs[rid][0] - self.reqs[rid][1], budget)
            scheduled.append((rid, n))
            budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            rid = self.waiting.pop(0)
            req = self.reqs[rid]
            req[1] = min(self.cached.get(self.keys[rid], 0),
                         min(req[4], req[0] - 1) // self.block * self.block)
            self.running.append(rid)
            scheduled.append((rid, min(req[0] - req[1], budget)))
            budget -= scheduled[-1][1]
        self.scheduled, self.produced = scheduled, []
        items = [self._apply(rid, n) for rid, n in scheduled]
        seconds = self._cost(items)
        return items, seconds, seconds, {"model": seconds}

    def _apply(self, rid: str, n: int) -> tuple[int, int, bool, bool]:
        req, key = self.reqs[rid], self.keys[rid]
        c, decode = req[1], n == 1 and req[2] > 0
        req[1] += n
        self.cached[key] = max(self.cached.get(key, 0),
                               min(req[1], req[4]) // self.block * self.block)
        samples = req[1] >= req[0]
        if samples:
            req[0] += 1
            req[2] += 1
            if req[2] >= req[3]:
                self.running.remove(rid)
            self.produced.append((rid, req[2], req[2] >= req[3]))
        return n, c, decode, samples

    def _cost(self, items: list[tuple[int, int, bool, bool]]) -> float:
        prefill = [(n, c) for n, c, decode, _ in items if not decode]
        x = {"step": 1.0, "tokens": sum(it[0] for it in items), "seqs": len(items),
             "sampled_seqs": sum(it[3] for it in items),
             "lm_head": 1.0 if any(it[3] for it in items) else 0.0,
             "prefill_attention_pairs": sum(n * c + n * (n + 1) // 2 for n, c in prefill),
             "prefill_context_tokens": sum(c for _, c in prefill),
             "decode_context_tokens": sum(c + 1 for _, c, decode, _ in items if decode)}
        return sum(coef * x[name] for name, coef in self.coefs.items())
