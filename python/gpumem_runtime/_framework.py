"""The tools both framework modules give, on the framework's idea of a device: each takes the
framework's device (an index, or its device object) and defaults to the current one."""
from . import _core


class DeviceTools:
    """gpumem's statistics, snapshots and observers for the devices that ``resolve`` turns into
    indexes (``resolve(None)``: the framework's current device)."""

    def __init__(self, resolve):
        self._resolve = resolve

    def functions(self):
        """The methods in the order the framework modules bind them: memory_stats,
        memory_summary, reset_peak_memory_stats, snapshot, export_snapshot, free_all_blocks,
        add_oom_observer, clear_oom_observers."""
        return (self.memory_stats, self.memory_summary, self.reset_peak_memory_stats, self.snapshot,
                self.export_snapshot, self.free_all_blocks, self.add_oom_observer, self.clear_oom_observers)

    def memory_stats(self, device=None):
        """The statistics with PyTorch's ``memory_stats()`` keys for what gpumem counts
        (see gpumem_runtime.memory_stats)."""
        return _core.memory_stats(self._resolve(device))

    def memory_summary(self, device=None):
        """The statistics as a readable table, as PyTorch's ``memory_summary()``."""
        return _core.memory_summary(self._resolve(device))

    def reset_peak_memory_stats(self, device=None):
        """Sets every peak to its current value (PyTorch's ``reset_peak_memory_stats()``)."""
        _core.reset_peak_memory_stats(self._resolve(device))

    def snapshot(self, device=None):
        """Segments and blocks as ``torch.cuda.memory._snapshot()`` gives them."""
        return _core.snapshot(self._resolve(device))

    def export_snapshot(self, path, device=None):
        """The snapshot as PyTorch's pickle, which ``torch.cuda._memory_viz`` and
        pytorch.org/memory_viz open (PyTorch's ``_dump_snapshot`` for gpumem's pool)."""
        _core.export_snapshot(path, self._resolve(device))

    def free_all_blocks(self, device=None):
        """Cached free blocks go back to the device (PyTorch's ``empty_cache()``, CuPy's
        ``free_all_blocks()``); memory in use stays."""
        _core.free_all_blocks(self._resolve(device))

    def add_oom_observer(self, observer, device=None):
        """``observer(device, message)`` runs on the allocating thread before an allocation
        fails for want of memory (PyTorch's ``_attach_out_of_memory_observer``)."""
        _core.add_oom_observer(observer, self._resolve(device))

    def clear_oom_observers(self, device=None):
        """Removes the out-of-memory observers of ``device``."""
        _core.clear_oom_observers(self._resolve(device))

    def planning(self):
        """The methods of the plan learned from the loop, in the order the framework modules
        bind them: step, plan_automatically, reset_planning, plan_state."""
        return (self.step, self.plan_automatically, self.reset_planning, self.plan_state)

    def step(self, device=None):
        """Marks the end of an iteration of the training (or serving) loop: after two iterations
        that repeat, the next ones are served from one planned block (see
        gpumem_runtime.step)."""
        _core.step(self._resolve(device))

    def plan_automatically(self, device=None):
        """Plans the loop with no ``step()`` calls: the pool finds the loop's period itself
        (see gpumem_runtime.plan_automatically)."""
        _core.plan_automatically(self._resolve(device))

    def reset_planning(self, device=None):
        """Stops planning and drops the plan (see gpumem_runtime.reset_planning)."""
        _core.reset_planning(self._resolve(device))

    def plan_state(self, device=None):
        """``"off"``, ``"recording"``, ``"planned"`` or ``"detecting"``."""
        return _core.plan_state(self._resolve(device))


def configure(policy, limit, devices):
    """Sets each device's growth policy and limit; either may be one value for every device or a
    dict ``{device: value}``, and None leaves the setting as it is."""
    for name, value in (("policy", policy), ("limit", limit)):
        if isinstance(value, dict) and set(value) - set(devices):
            raise ValueError(f"{name} names devices that are not being configured: "
                             f"{sorted(set(value) - set(devices))}")
    for d in devices:
        device_policy = policy.get(d) if isinstance(policy, dict) else policy
        device_limit = limit.get(d) if isinstance(limit, dict) else limit
        if device_policy is not None:
            _core.set_growth_policy(device_policy, d)
        if device_limit is not None:
            _core.set_limit(device_limit, d)
