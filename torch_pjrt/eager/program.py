"""A fused graph's XLA program: built from the graph's wiring, compiled at its first run, or
on a compile thread while the graph's ops run one by one (eager/tiers.py)."""

from __future__ import annotations

import time
import warnings

import jax

from .. import counters, logs
from ..runtime import client, compile_cache, compile_pool, cpu_kernels, watch

warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Program:
    """A compiled graph: the jitted program, its compiled form once there is one, and the
    state of its compile (on disk, in the background, failed)."""

    __slots__ = ("jitted", "compiled", "name", "flag_nodes", "entries", "device", "job",
                 "failed", "looked", "needs", "wanted", "ops", "asked_at")

    def __init__(self, jitted, name: str, entries: list, device: int):
        self.jitted = jitted
        self.device = device
        self.compiled = None
        self.name = name  # the digest of the program in the persistent cache
        self.entries = entries  # the op entry of each node, in order
        self.flag_nodes: list[int] = []  # nodes whose entry returns check flags, in order
        self.job: compile_pool.Job | None = None  # its compile on a compile thread
        self.failed: Exception | None = None  # that compile's error
        self.looked = False  # the disk cache was asked for it
        self.needs = 0  # flushes that wanted it before it was compiled (at least 2 once
        # a flush wanted it twice: tiers.fused_now)
        self.wanted = -1  # the last of them (tiers.epoch)
        self.ops = len(entries)
        self.asked_at = None  # the user's line when its background compile was asked for

    def __call__(self, *args):
        if self.compiled is None:
            self.compiled = compile_cache.compile(self.jitted, args, self.name, self.device,
                                                  get_side=self._side, set_side=self._restore,
                                                  drop=self._drop)
        return self.compiled(*args)

    def compile_now(self, args: list) -> None:
        """Compile (or load) it for `args`, counted as a compile the user waited for."""
        start = time.perf_counter()
        self.compiled = compile_cache.compile(self.jitted, args, self.name, self.device,
                                              get_side=self._side, set_side=self._restore,
                                              drop=self._drop)
        counters.count("compiles")
        counters.add_compile_time(time.perf_counter() - start)

    def load(self, args: list) -> bool:
        """Take it from the disk cache if it is there (asked once: later misses compile)."""
        self.looked = True
        start = time.perf_counter()
        built = compile_cache.obtain(self.jitted, args, self.name, self.device, build=False)
        if built is None:
            return False
        self.compiled = compile_cache.finish(built, self.name, self._restore, self._drop)
        counters.count("compiles")
        counters.add_compile_time(time.perf_counter() - start)
        return True

    def compile_in_background(self, args: list) -> None:
        """Compile it on a compile thread for arguments like `args`; taken into use at the
        first flush after it is ready (compile_pool.poll)."""
        avals = [aval(a) for a in args]

        def work():
            return compile_cache.obtain(self.jitted, avals, self.name, self.device,
                                        get_side=self._side)

        self.asked_at = watch.site()
        self.job = compile_pool.Job(work, self._done, self.name)
        compile_pool.submit(self.job)

    def _done(self, built, error: Exception | None) -> None:
        self.job = None
        if isinstance(error, compile_pool.Cancelled):
            return  # queued again when it is needed again
        if error is not None:
            self.failed = error
            counters.count("background_compile_errors")
            logs.compiles.warning("the fused program %s (%d ops) failed to compile in the "
                                  "background; its ops keep running one by one (a graph "
                                  "that cannot compiles it again, and raises): %r",
                                  self.name[:12], self.ops, error)
            return
        with watch.background(self.asked_at):  # (counted as a compile nobody waited for)
            self.compiled = compile_cache.finish(built, self.name, self._restore, self._drop)
        counters.count("compiles")

    def _drop(self) -> None:
        """Let go of the program (compile_cache._hold): the next run loads it again."""
        self.compiled = None
        self.looked = False

    def _side(self):
        return {p: self.entries[p].checks for p in self.flag_nodes}

    def _restore(self, side: dict) -> None:
        self.flag_nodes = sorted(side)
        for p, entry_checks in side.items():
            self.entries[p].set_checks(entry_checks)


def aval(a):
    """An argument as a compile thread lowers for it: arrays by shape, dtype and placement
    (the thread holds no buffer the user's thread may donate), numbers as they are."""
    if isinstance(a, jax.Array):
        return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding,
                                    weak_type=a.aval.weak_type)
    return a


def build(wiring, outputs, n_inputs: int, donated: list[int], device: int,
          dyn_types: tuple) -> Program:
    """The program of a graph: `wiring` is (entry, refs, number of run-time values) per
    node, a ref being None (no input), an input slot, or (node, output) of an earlier
    node; it returns `outputs` ((node, output) each) and every node's check flags. Its
    arguments: the donated input slots first, then the others, then the run-time values."""
    order = donated + [i for i in range(n_inputs) if i not in set(donated)]
    stable = (tuple((entry.digest, refs, n) for entry, refs, n in wiring), tuple(outputs),
              tuple(donated), n_inputs, dyn_types)
    plan = Program(None, compile_cache.digest(stable, device), [w[0] for w in wiring], device)

    def program(*flat):
        placed = [None] * n_inputs
        for i, v in zip(order, flat[:n_inputs]):
            placed[i] = v
        dyn = flat[n_inputs:]
        d = 0
        produced: list[tuple] = []
        flags = []
        flag_nodes = []
        for position, (entry, refs, n_dyn) in enumerate(wiring):
            args = [None if r is None else
                    placed[r] if type(r) is int else produced[r[0]][r[1]] for r in refs]
            with jax.named_scope(f"{position}:{entry.name}"):  # names the HLO ops' origin
                if entry.jaxpr is None:  # an op first seen in strict mode
                    res = entry.trace(*args, *dyn[d:d + n_dyn])
                else:
                    # flat inputs as make_jaxpr saw them (None, here or in dyn, is no input)
                    res = entry.jaxpr(*jax.tree.leaves((args, dyn[d:d + n_dyn])))
            d += n_dyn
            if entry.checks:
                flags.append(res[-1])
                flag_nodes.append(position)
            produced.append(res)
        plan.flag_nodes = flag_nodes
        return tuple(produced[p][i] for p, i in outputs), tuple(flags)

    sharding = jax.sharding.SingleDeviceSharding(client.device(device))
    products = any(entry.products for entry, _, _ in wiring)
    plan.jitted = jax.jit(cpu_kernels.rewrite(program, products), out_shardings=sharding,
                          donate_argnums=tuple(range(len(donated))))
    return plan
