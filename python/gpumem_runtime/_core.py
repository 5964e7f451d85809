"""What PyTorch and CuPy users share: errors, limits, growth policies, statistics, snapshots, the
recorder and out-of-memory observers, each a call of the C ABI."""
import ctypes
import json
import os

from ._abi import lib, OOM_OBSERVER

__all__ = [
    "GpumemError", "version", "backend", "last_error", "GROWTH_POLICIES", "policy_name",
    "set_growth_policy", "get_growth_policy", "set_limit", "set_limit_fraction", "get_limit",
    "free_all_blocks", "memory_stats", "memory_summary", "reset_peak_memory_stats", "snapshot",
    "export_snapshot", "start_recording", "stop_recording", "Recording", "add_oom_observer",
    "clear_oom_observers", "step", "plan_automatically", "reset_planning", "plan_state", "PLAN_STATES",
]


class GpumemError(RuntimeError):
    """A gpumem call failed (a bad argument, an unknown device, a file that cannot be written);
    the message is gpumem's. Out of memory is reported as the framework's own exception instead."""


def last_error():
    """The message of this thread's last failed gpumem call, or None."""
    message = lib.gpumem_last_error()
    return message.decode(errors="replace") if message is not None else None


def _check(status):
    if status < 0:
        raise GpumemError(last_error() or "gpumem call failed without a message")
    return status


def version():
    """gpumem's version, ``"MAJOR.MINOR.PATCH"``."""
    return lib.gpumem_version().decode()


def backend():
    """The backend this wheel was built with: ``"cuda"``, or ``"host"`` (device memory is host
    memory; for tests and machines without a GPU)."""
    from . import _native
    return _native.backend()


#: The growth policies by their names (those of the Rust ``GrowthPolicy``, in snake_case).
GROWTH_POLICIES = ("cache_until_out_of_memory", "release_before_grow", "hold_peak_in_use", "segments")

_POLICY_ALIASES = {
    "default": "cache_until_out_of_memory",
    "cupy": "cache_until_out_of_memory",
    "cache": "cache_until_out_of_memory",
    "release": "release_before_grow",
    "hold_peak": "hold_peak_in_use",
    "peak": "hold_peak_in_use",
    "segmented": "segments",
    "size_classes": "segments",
}


def policy_name(name):
    """The growth policy that ``name`` means: one of GROWTH_POLICIES, in any case, with ``-`` or
    ``_`` or in CamelCase (``"HoldPeakInUse"``), or an alias (``"cupy"``/``"default"``,
    ``"release"``, ``"hold_peak"``, ``"segmented"``). Raises ValueError for anything else."""
    if not isinstance(name, str):
        raise TypeError(f"a growth policy is named by a string, not {type(name).__name__}")
    key = name.strip()
    if key != key.lower() and key != key.upper():  # CamelCase, as the Rust enum spells it
        key = "".join("_" + c if c.isupper() else c for c in key).lstrip("_")
    key = key.replace("-", "_").replace(" ", "_").lower()
    key = _POLICY_ALIASES.get(key, key)
    if key not in GROWTH_POLICIES:
        known = ", ".join(GROWTH_POLICIES + tuple(sorted(_POLICY_ALIASES)))
        raise ValueError(f"unknown growth policy {name!r}; known: {known}")
    return key


def set_growth_policy(name, device=0):
    """Sets how ``device``'s pool grows, by name (see policy_name)."""
    _check(lib.gpumem_set_growth_policy(device, policy_name(name).encode()))


def get_growth_policy(device=0):
    """The name of ``device``'s growth policy, one of GROWTH_POLICIES."""
    name = lib.gpumem_get_growth_policy(device)
    if name is None:
        raise GpumemError(last_error())
    return name.decode()


def set_limit(limit, device=0):
    """Limits the memory ``device``'s pool holds: an int is bytes, a float in (0, 1] a fraction of
    the device's memory; 0 or None removes the limit. An allocation that would pass it first makes
    the pool release its cache and retry, then fails as out of memory."""
    if limit is None or limit == 0:
        _check(lib.gpumem_set_limit(device, 0))
    elif isinstance(limit, float):
        _check(lib.gpumem_set_limit_fraction(device, limit))
    elif isinstance(limit, int) and limit > 0:
        _check(lib.gpumem_set_limit(device, limit))
    else:
        raise ValueError(f"a limit is a positive number of bytes or a fraction in (0, 1], not {limit!r}")


def set_limit_fraction(fraction, device=0):
    """Limits ``device``'s pool to ``fraction`` of the device's memory; 0 removes the limit."""
    _check(lib.gpumem_set_limit_fraction(device, float(fraction)))


def get_limit(device=0):
    """``device``'s limit in bytes; 0 when unlimited."""
    out = ctypes.c_size_t(0)
    _check(lib.gpumem_get_limit(device, ctypes.byref(out)))
    return out.value


def free_all_blocks(device=0):
    """Releases ``device``'s cached free blocks to the device (PyTorch's ``empty_cache()``,
    CuPy's ``free_all_blocks()``); memory in use stays."""
    _check(lib.gpumem_free_all_blocks(device))


def step(device=0):
    """Marks the end of an iteration of the loop that allocates on ``device``: call it after each
    training step (or served batch). The first call turns planning on: once two iterations in a
    row make the same allocations in the same order, the next ones are served from one planned
    block, with no call to the device's allocator and little more held than is in use. Whatever
    departs from the plan (a new shape, another order) is served as without one, with no error,
    and a loop that changes is planned again. A program that never calls it sees no change."""
    _check(lib.gpumem_step(device))


def plan_automatically(device=0):
    """Plans the loop on ``device`` with no ``step()`` calls: the pool finds the loop's period
    from its allocations and marks the iterations itself, then plans as ``step()`` would. For
    programs whose loop cannot be edited; a later ``step()`` turns it off."""
    _check(lib.gpumem_plan_automatically(device))


def reset_planning(device=0):
    """Stops planning on ``device`` and drops its plan (its block becomes ordinary cached
    memory); ``step()`` starts planning again."""
    _check(lib.gpumem_reset_planning(device))


#: What ``plan_state()`` returns: no ``step()`` yet, recording the loop, a plan in force, watching
#: for the loop's period (``plan_automatically()``).
PLAN_STATES = ("off", "recording", "planned", "detecting")


def plan_state(device=0):
    """Where ``device``'s planner stands: one of ``PLAN_STATES``."""
    return PLAN_STATES[_check(lib.gpumem_plan_state(device))]


def _text(fn, device):
    n = _check(fn(device, None, 0))
    buf = ctypes.create_string_buffer(n + 1)
    n = _check(fn(device, buf, n + 1))
    return buf.raw[:n].decode()


def memory_stats(device=0):
    """``device``'s statistics as a dict with PyTorch's ``torch.cuda.memory_stats()`` keys for what
    gpumem counts: ``"allocated_bytes.all.current"``, ``"reserved_bytes.all.peak"``,
    ``"active_bytes.all.freed"``, ``"requested_bytes.all.allocated"``, ``"allocation.all.current"``,
    ``"segment.all.peak"``, ..., ``"num_alloc_retries"``, ``"num_ooms"``, ``"num_device_alloc"``,
    ``"num_device_free"``; and gpumem's own under ``"gpumem."`` (cache hits and misses, and
    ``peaks_exact``: 0 when several streams' peaks were summed, an upper bound)."""
    return json.loads(_text(lib.gpumem_memory_stats, device))


def memory_summary(device=0):
    """``device``'s statistics as a readable table, as PyTorch's ``memory_summary()``."""
    return _text(lib.gpumem_memory_summary, device)


def reset_peak_memory_stats(device=0):
    """Sets every peak of ``device``'s statistics to its current value."""
    _check(lib.gpumem_reset_peak_stats(device))


def snapshot(device=0):
    """``device``'s segments and blocks as the dict ``torch.cuda.memory._snapshot()`` returns:
    ``{"segments": [...], "device_traces": [...]}``, each segment with its address, sizes, stream
    and blocks (address, size, requested size, state: ``inactive``, ``active_allocated`` or
    ``active_pending_free``)."""
    return json.loads(_text(lib.gpumem_snapshot_json, device))


def export_snapshot(path, device=0):
    """Writes ``device``'s snapshot to ``path`` as PyTorch's snapshot pickle: open it with
    ``python -m torch.cuda._memory_viz segment_plot PATH -o page.html`` or at
    pytorch.org/memory_viz."""
    _check(lib.gpumem_export_snapshot(device, os.fsencode(path)))


def start_recording(path):
    """Starts recording every allocation and free of every thread and stream (PyTorch's autograd
    threads included) into ``path``: the trace ``gpumem-trace stats PATH`` and
    ``gpumem-trace plot PATH`` read. One recording at a time; stop it with stop_recording."""
    _check(lib.gpumem_recorder_start(os.fsencode(path)))


def stop_recording():
    """Stops the recording, closes its file and returns the number of lines written."""
    return _check(lib.gpumem_recorder_stop())


class Recording:
    """``with gpumem_runtime.Recording("trace.jsonl") as r: ...``: start_recording and
    stop_recording around a block; ``r.lines`` is the number of lines written after it."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self.lines = None

    def __enter__(self):
        start_recording(self.path)
        return self

    def __exit__(self, *exc):
        self.lines = stop_recording()
        return False


_observers = []  # the ctypes callbacks, kept alive while the pool may call them


def add_oom_observer(observer, device=0):
    """Calls ``observer(device, message)`` on the allocating thread before an allocation on
    ``device`` fails for want of memory (PyTorch's ``_attach_out_of_memory_observer``). It must not
    allocate GPU memory. An exception it raises is printed and ignored."""
    def trampoline(_user_data, dev, message):
        try:
            observer(dev, message.decode(errors="replace"))
        except Exception:  # an exception cannot cross into the allocator
            import traceback
            traceback.print_exc()

    callback = OOM_OBSERVER(trampoline)
    _check(lib.gpumem_add_oom_observer(device, callback, None))
    _observers.append((device, callback))


def clear_oom_observers(device=0):
    """Removes every out-of-memory observer of ``device``."""
    _check(lib.gpumem_clear_oom_observers(device))
    # Dropped only now: the pool no longer holds their addresses.
    _observers[:] = [(d, c) for d, c in _observers if d != device]
