"""Policy names -> classes, and loading a user's ``module:Class`` (an importable module,
or a ``path/to/file.py``). A built-in policy's module is imported when the policy is
first asked for, so a run loads the one policy it runs."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import ClassVar, Protocol, runtime_checkable

from sim.config import SchedulerConfig
from sim.interface import Scheduler
from sim.kv.block_pool import KVCacheManager


@runtime_checkable
class Policy(Scheduler, Protocol):
    """What the engine calls (sim.interface.Scheduler), plus a name: the contract of
    policies/base.py's module docstring. Checked here, where a user's class is loaded."""

    name: ClassVar[str]


#: The built-in policies: name (the class's ``name``) -> ``module:Class``, imported by
#: get_policy_class when asked for.
POLICIES: dict[str, str] = {
    "chunked": "policies.chunked:ChunkedPolicy",
    "continuous": "policies.continuous:ContinuousPolicy",
    "static": "policies.static:StaticPolicy",
}


def get_policy_class(name: str) -> type:
    """A built-in policy by name, or ``module:Class`` from the user's code.

    Raises ValueError naming the known policies, the module/class that failed to load, an
    empty module or class name, or an object that is not a policy class (_check_policy_class).
    """
    if name in POLICIES:
        mod_name, _, cls_name = POLICIES[name].partition(":")
        built_in: type = getattr(importlib.import_module(mod_name), cls_name)
        return built_in
    if ":" in name:
        mod_name, _, cls_name = name.rpartition(":")
        if not mod_name or not cls_name:
            raise ValueError(f"policy {name!r}: expected module:Class or path/to/file.py:Class "
                             "with both parts non-empty")
        mod = _load_module(name, mod_name)
        cls = getattr(mod, cls_name, None)
        if cls is None:
            raise ValueError(f"policy {name!r}: module {mod_name!r} has no {cls_name!r}")
        return _check_policy_class(name, cls)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)} or module:Class")


#: The methods the engine calls on a policy (sim.interface.Scheduler; num_waiting may be an
#: instance attribute, so it is not looked for on the class).
_ENGINE_METHODS = ("add_request", "schedule", "on_step_end", "has_unfinished_requests",
                   "stuck_request")


def _check_policy_class(name: str, cls: object) -> type:
    """``cls`` when it is a concrete class with the engine's methods (so a function, an
    exception, a protocol or an abstract base such as QueuePolicy is refused before a run).

    Raises ValueError naming the policy and what is missing.
    """
    expected = "a class with schedule(now) and the other Scheduler methods, see policies/base.py"
    if not isinstance(cls, type):
        raise ValueError(f"policy {name!r} is not a policy class ({expected})")
    missing = [m for m in _ENGINE_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"policy {name!r} is not a policy class ({expected}); "
                         f"missing: {', '.join(missing)}")
    if getattr(cls, "_is_protocol", False) or inspect.isabstract(cls):
        raise ValueError(f"policy {name!r} is a protocol or abstract class, not a policy class "
                         f"({expected})")
    return cls


def _load_module(name: str, mod_name: str) -> ModuleType:
    if not mod_name.endswith(".py"):
        try:
            return importlib.import_module(mod_name)
        except ImportError as e:
            raise ValueError(f"policy {name!r}: cannot import module {mod_name!r} ({e})") from e
    path = Path(mod_name).resolve()
    if not path.is_file():
        raise ValueError(f"policy {name!r}: no such file {mod_name!r}")
    key = f"servesim_user_policy_{abs(hash(str(path)))}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[key] = mod  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        del sys.modules[key]
        raise ValueError(f"policy {name!r}: cannot load {mod_name!r} ({e!r})") from e
    return mod


def make_policy(name: str, config: SchedulerConfig, kv: KVCacheManager) -> Policy:
    """Build a policy and check it implements the Policy protocol."""
    policy = get_policy_class(name)(config, kv)
    if not isinstance(policy, Policy):
        raise ValueError(f"policy {name!r} does not implement the Policy protocol")
    return policy
