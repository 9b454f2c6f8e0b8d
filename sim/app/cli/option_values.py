"""What a command's option values become before they build a RunConfig: the values of
its ``--config`` file under the flags given, and vLLM's spellings read as servesim's
options (``--[no-]enable-prefix-caching``, ``--[no-]enable-chunked-prefill``, bench
serve's ``--goodput ttft:MS tpot:MS``, the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN). The
options themselves are declared in sim/app/cli/options.py.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable, Mapping
from typing import Any, get_args

import typer

from sim.app.cli.options import FRONTEND_OPTIONS, OPTIONS


def config_options(ctx: typer.Context, opts: dict[str, Any],
                   list_forms: Collection[str] = ()) -> dict[str, Any]:
    """A command's option values with those of its ``--config`` file where no flag was
    given (``ctx``, the command's context, says which were), and
    ``--[no-]enable-prefix-caching`` as ``prefix_cache``, and vLLM's env var
    VLLM_ALLOW_LONG_MAX_MODEL_LEN as ``--allow-long-max-model-len`` (allow_long);
    sim/app/runs/config_file.py reads the file. ``list_forms`` are the options the command takes
    comma-separated (sweep's and plan's axes). Prints the file's warnings (ignored keys,
    a changed trace) on stderr, one line each; bad input exits with one line (fail)."""
    from sim.app.cli.common import INPUT_ERRORS, fail, warn

    try:
        opts, warnings = _with_file(dict(opts), given_options(ctx, opts), set(list_forms))
    except INPUT_ERRORS as e:
        fail(str(e))
    allow_long(opts, os.environ)
    for line in warnings:
        warn(line)
    return opts


def _with_file(opts: dict[str, Any], given: set[str],
               list_forms: set[str]) -> tuple[dict[str, Any], list[str]]:
    """config_options' work: the merged values (a mode flag's digits as vLLM's command
    line reads them: cudagraph_settings.flag_mode) and the warnings; ValueError or
    OSError for a bad file or contradicting flags."""
    from sim.app.runs.config_file import read_config, trace_change
    from sim.app.runs.cudagraph_settings import MODE_FIELDS, flag_mode

    for name in MODE_FIELDS:
        if name in given and isinstance(opts.get(name), str):
            opts[name] = flag_mode(opts[name])
    path, switch = opts.pop("config", None), opts.pop("enable_prefix_caching", None)
    if switch is not None:
        _switch(opts, switch, "prefix_cache" in given)
        given.add("prefix_cache")
    goodput = opts.pop("goodput", None)
    if goodput is not None:
        _goodput(opts, goodput, given)
    chunked = opts.pop("enable_chunked_prefill", None)
    if chunked is not None:
        _chunked_switch(opts, chunked, "policy" in given)
        given.add("policy")
    if path is None:
        return opts, []
    seeds = "seeds" in opts  # sweep's and plan's list of seeds reads a file's seed
    cf = read_config(path, set(opts) | ({"seed"} if seeds else set()))
    warnings = list(cf.notes)
    if cf.ignored:
        warnings.append(f"config {path}: ignored, not options of this command: "
                        + ", ".join(cf.ignored))
    for name, value in cf.values.items():
        name = "seeds" if name == "seed" and seeds else name
        if name not in given:
            opts[name] = _value(name, value, name in list_forms or name == "seeds")
    from_file = "trace" in cf.values and "trace" not in given
    changed = trace_change(cf, opts["trace"]) if from_file else None
    if changed is not None:
        warnings.append(changed)
    return opts, warnings


#: vLLM's env var that allows a max_model_len above the model's context (vLLM 0.32
#: vllm/envs.py: "1" or "true", any case, spaces stripped).
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"


def allow_long(opts: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Set ``allow_long_max_model_len`` in a command's ``opts`` (when it takes it) where
    ``environ`` sets VLLM_ALLOW_LONG_MAX_MODEL_LEN as vLLM reads it; the flag, a config
    file or the env var each allow it."""
    if "allow_long_max_model_len" not in opts:
        return
    if environ.get(ALLOW_LONG_ENV, "0").strip().lower() in ("1", "true"):
        opts["allow_long_max_model_len"] = True


def given_options(ctx: typer.Context, opts: Iterable[str]) -> set[str]:
    """The options given on the command line (or by environment), as click records
    them in the command's context (its ParameterSource, read by name: typer may bring
    its own copy of click)."""
    sources = {n: ctx.get_parameter_source(n) for n in opts}
    return {n for n, s in sources.items()
            if s is not None and s.name not in ("DEFAULT", "DEFAULT_MAP")}


def _switch(opts: dict[str, Any], on: bool, prefix_cache_given: bool) -> None:
    """--[no-]enable-prefix-caching: prefix_cache block or none; with --prefix-cache
    given too, each of its modes must agree (radix is a prefix cache on)."""
    if not prefix_cache_given:
        opts["prefix_cache"] = "block" if on else "none"
        return
    modes = [m.strip() for m in str(opts["prefix_cache"]).split(",")]
    if not all((m != "none") == on for m in modes):
        flag = "--enable-prefix-caching" if on else "--no-enable-prefix-caching"
        raise ValueError(f"{flag} contradicts --prefix-cache {opts['prefix_cache']}")


def _goodput(opts: dict[str, Any], text: str, given: set[str]) -> None:
    """--goodput as slo_ttft / slo_tpot (seconds); one also given as --slo-* must agree."""
    from sim.latency_stats import parse_goodput

    for name, value_s in parse_goodput(text).items():
        if name in given and opts[name] != value_s:
            raise ValueError(f"--goodput {text} contradicts --{name.replace('_', '-')} "
                             f"{opts[name]:g} (s)")
        opts[name] = value_s
        given.add(name)


def _chunked_switch(opts: dict[str, Any], on: bool, policy_given: bool) -> None:
    """--[no-]enable-chunked-prefill: policy chunked or continuous; with --policy given
    too, each of its policies must be the one the switch names."""
    policy = "chunked" if on else "continuous"
    if not policy_given:
        opts["policy"] = policy
        return
    if any(p.strip() != policy for p in str(opts["policy"]).split(",")):
        flag = "--enable-chunked-prefill" if on else "--no-enable-chunked-prefill"
        raise ValueError(f"{flag} (--policy {policy}) contradicts --policy {opts['policy']}")


def _value(name: str, value: Any, listed: bool) -> Any:
    """A file's ``value`` for option ``name``: comma-separated text for a list form or
    for a list given to a list-valued option (Opt.list_valued: cudagraph_capture_sizes),
    else checked against the option's type (an int is a float, and a mode's value,
    cudagraph_settings.MODE_FIELDS, as vLLM takes one; ValueError otherwise)."""
    from sim.app.runs.cudagraph_settings import MODE_FIELDS

    opt = {**OPTIONS, **{o.name: o for o in FRONTEND_OPTIONS}}.get(name)
    if listed or (opt is not None and opt.list_valued and isinstance(value, list)):
        items = value if isinstance(value, list) else [value]
        return ",".join(str(v).lower() if isinstance(v, bool) else str(v) for v in items)
    if opt is None or value is None:
        return value
    types = get_args(opt.type) or (opt.type,)
    if name in MODE_FIELDS and isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and float in types:
        return float(value)
    if isinstance(value, bool) and bool not in types:
        ok = False
    else:
        ok = any(isinstance(value, t) for t in types if t is not type(None))
    if not ok:
        wanted = " or ".join(t.__name__ for t in types if t is not type(None))
        raise ValueError(f"config: {name} must be {wanted}, got {value!r}")
    return value


def join_goodput(args: list[str]) -> list[str]:
    """``args`` with the KEY:VALUE words after each ``--goodput`` joined into its one
    value, so ``--goodput ttft:2000 tpot:50`` (vLLM's nargs="+") reads as it does in
    vLLM; click options take one word each."""
    out: list[str] = []
    i = 0
    while i < len(args):
        out.append(args[i])
        i += 1
        if out[-1] != "--goodput":
            continue
        j = i
        while j < len(args) and not args[j].startswith("-") and ":" in args[j]:
            j += 1
        if j > i:
            out.append(" ".join(args[i:j]))
            i = j
    return out
