"""Collectives as XLA programs over a process group's devices (one per rank).

Each rank passes its local flat buffer; the program sees them as one array sharded over
the group's mesh (axis "r") and runs the collective with shard_map, so XLA's own
collectives move the data (gloo on XLA:CPU, NCCL on GPUs, the ICI on TPUs). Programs
are compiled once per (collective, parameters, shapes, dtypes) and group. Every rank
of the group must launch the same programs in the same order; process_group.py sees to
that (and checks it first, see agreement.py).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..runtime import client, device_trace

AXIS = "r"

# torch.distributed.ReduceOp.RedOpType names
SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM = (
    "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM")
_BITWISE = (BAND, BOR, BXOR)


def process_device(process: int) -> jax.Device:
    """The device a process computes collectives on: its first (runtime/client.py)."""
    return min((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


_done: jax.Array | None = None  # this rank's done marker of the last collective program


class Group:
    """The XLA side of one process group: the mesh of its ranks' devices and the
    collective programs compiled for it."""

    def __init__(self, processes: list[int], rank: int):
        self.n = len(processes)
        self.rank = rank
        self.mesh = Mesh(np.array([process_device(p) for p in processes]), (AXIS,))
        self.sharding = NamedSharding(self.mesh, P(AXIS))
        self.device = self.mesh.devices[rank]
        self.index = client.devices().index(self.device)  # as a pjrt device
        self.label = ""  # what the next collective is called in a profile (its caller says)
        self._programs: dict[tuple, Callable] = {}

    def run(self, kind: str, params: tuple, arrays: list[jax.Array]) -> list[jax.Array]:
        """Collective `kind` over this rank's flat `arrays`: this rank's flat results."""
        return self.run_body((kind, params), lambda: _BODIES[kind](self.n, *params), arrays)

    def run_body(self, key: tuple, make_body: Callable, arrays: list[jax.Array]
                 ) -> list[jax.Array]:
        """The SPMD program `make_body()` (a function of this rank's flat blocks, returning
        a list of flat blocks; compiled once per `key` and input shapes) on `arrays`;
        in a profile, an activity on the device's collectives track named `self.label`."""
        global _done
        if _done is None:
            _done = jax.device_put(np.zeros((1,), np.int8), self.device)
        key = (key, tuple((a.shape, a.dtype) for a in arrays))
        program = self._programs.get(key)
        if program is None:
            program = self._programs[key] = self._compile(make_body(), [*arrays, _done])
        # XLA:CPU runs programs that share no buffer at the same time: two collective
        # programs in flight at once (a compiled backward's, then an eager all_reduce) put
        # their messages on the wire in an order that can differ between ranks, and the
        # transport fails ("Received data size doesn't match expected size"). So each
        # collective program, of any group (groups of the same ranks share a transport),
        # takes the one before's done marker as an input: PJRT starts it once that one has
        # finished, in the order of the calls, and the host never waits for it.
        executable, count = program
        launched = device_trace.now() if device_trace.active else 0
        after = device_trace.producers(arrays, self.index) if launched else None
        *outs, (_done,) = executable.execute_sharded([*arrays, _done]) \
            .disassemble_into_single_device_arrays()
        if launched:
            device_trace.run(f"pjrt collective: {self.label or key[0][0]}", self.index,
                             launched, [_done], {"ranks": self.n, "bytes": sum(
                                 a.size * a.dtype.itemsize for a in arrays)},
                             kind=device_trace.COLLECTIVE, after=after)
        if len(outs) + 1 != count:  # jax.jit forwards some outputs itself, above this call
            raise RuntimeError(f"pjrt: collective program {key[0]!r} returned {len(outs) + 1} "
                               f"buffers, not its {count} outputs")
        return [out for (out,) in outs]

    def _compile(self, body: Callable, arrays: list[jax.Array]):
        """The loaded executable of `body` over the mesh (its last input and output the done
        markers) and its number of outputs. It is called with this rank's own single-device
        buffers and gives back its own: jax.jit's call would first assemble them into
        global arrays and take them apart after, which doubled the host time of a small
        collective."""
        def blocks(*xs):
            *xs, done = xs
            return (*body(*xs), done + 1)

        program = jax.jit(jax.shard_map(
            blocks, mesh=self.mesh, in_specs=(P(AXIS),) * len(arrays), out_specs=P(AXIS),
            check_vma=False), keep_unused=True)  # called with every input
        specs = [jax.ShapeDtypeStruct((self.n * a.shape[0],), a.dtype, sharding=self.sharding)
                 for a in arrays]
        compiled = program.lower(*specs).compile()
        return compiled._executable.xla_executable, len(compiled.out_info)


# ---------------------------------------------------------------- reductions
def _is_bool(x) -> bool:
    return x.dtype == jnp.bool_


def reduce_all(x, op: str, n: int, factor: float | None = None):
    """x reduced with `op` across the group (every rank gets the result)."""
    if _is_bool(x):
        return _reduce_bool(x, op)
    if op == SUM:
        return lax.psum(x, AXIS)
    if op == AVG:
        return _divide(lax.psum(x, AXIS), n)
    if op == PREMUL_SUM:
        return lax.psum((x * jnp.asarray(factor, x.dtype)).astype(x.dtype), AXIS)
    if op == MAX:
        return lax.pmax(x, AXIS)
    if op == MIN:
        return lax.pmin(x, AXIS)
    return _reduce_rows(lax.all_gather(x, AXIS), op)


def _reduce_rows(rows, op: str):
    """rows[i] is rank i's value: reduced over ranks in rank order."""
    fn = {PRODUCT: jnp.multiply, BAND: jnp.bitwise_and, BOR: jnp.bitwise_or,
          BXOR: jnp.bitwise_xor, SUM: jnp.add, MAX: jnp.maximum, MIN: jnp.minimum}[op]
    out = rows[0]
    for i in range(1, rows.shape[0]):
        out = fn(out, rows[i])
    return out


def _reduce_bool(x, op: str):
    """Booleans: a sum or maximum is any, a product or minimum all (as gloo does)."""
    rows = lax.all_gather(x.astype(jnp.uint8), AXIS)
    if op in (SUM, MAX, BOR, AVG, PREMUL_SUM):
        return jnp.any(rows != 0, axis=0)
    if op in (PRODUCT, MIN, BAND):
        return jnp.all(rows != 0, axis=0)
    return (jnp.sum(rows, axis=0) % 2).astype(jnp.bool_)  # BXOR


def _divide(x, n: int):
    if jnp.issubdtype(x.dtype, jnp.integer):
        return lax.div(x, jnp.asarray(n, x.dtype))  # truncates, as C integer division does
    return x / jnp.asarray(n, x.dtype)


# ------------------------------------------------------------------- bits
# Moving one rank's data exactly (broadcast, scatter, send): as integers of the same
# width, where the other ranks contribute zeros to a sum.
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _as_bits(x):
    if _is_bool(x):
        return x.astype(jnp.uint8)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        parts = jnp.stack([x.real, x.imag], axis=-1).reshape(-1)
        return lax.bitcast_convert_type(parts, _UINT[parts.dtype.itemsize])
    return lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize])


def _from_bits(bits, like):
    if _is_bool(like):
        return bits != 0
    if jnp.issubdtype(like.dtype, jnp.complexfloating):
        parts = lax.bitcast_convert_type(bits, like.real.dtype).reshape(-1, 2)
        return lax.complex(parts[:, 0], parts[:, 1])
    return lax.bitcast_convert_type(bits, like.dtype)


def _from_root(x, root: int):
    """Rank `root`'s x on every rank, bit for bit."""
    mine = lax.axis_index(AXIS) == root
    bits = _as_bits(x)
    return _from_bits(lax.psum(jnp.where(mine, bits, jnp.zeros_like(bits)), AXIS), x)


# ------------------------------------------------------------------ bodies
# Each takes the group size and the collective's parameters and returns the function of
# this rank's flat blocks that shard_map runs.
def _all_reduce(n: int, op: str, factor: float | None):
    return lambda *xs: [reduce_all(x, op, n, factor) for x in xs]


def _broadcast(n: int, root: int):
    return lambda *xs: [_from_root(x, root) for x in xs]


def _all_gather(n: int):
    return lambda *xs: [lax.all_gather(x, AXIS, tiled=True) for x in xs]


def _reduce_scatter(n: int, op: str, factor: float | None):
    def one(x):
        if op in (SUM, AVG, PREMUL_SUM) and not _is_bool(x):
            if op == PREMUL_SUM:
                x = (x * jnp.asarray(factor, x.dtype)).astype(x.dtype)
            out = lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
            return _divide(out, n) if op == AVG else out
        # row i of the exchange: rank i's block for this rank
        rows = lax.all_to_all(x.reshape(n, -1), AXIS, 0, 0, tiled=True)
        if _is_bool(x):
            return _reduce_bool_rows(rows, op)
        return _reduce_rows(rows, op)
    return lambda *xs: [one(x) for x in xs]


def _reduce_bool_rows(rows, op: str):
    rows = rows.astype(jnp.uint8)
    if op in (SUM, MAX, BOR, AVG, PREMUL_SUM):
        return jnp.any(rows != 0, axis=0)
    if op in (PRODUCT, MIN, BAND):
        return jnp.all(rows != 0, axis=0)
    return (jnp.sum(rows, axis=0) % 2).astype(jnp.bool_)


def _all_to_all(n: int):
    def one(x):
        return lax.all_to_all(x.reshape(n, -1), AXIS, 0, 0, tiled=True).reshape(-1)
    return lambda *xs: [one(x) for x in xs]


def _scatter(n: int, root: int):
    def one(x):
        mine = lax.axis_index(AXIS) == root
        bits = _as_bits(x)
        bits = jnp.where(mine, bits, jnp.zeros_like(bits))
        out = lax.psum_scatter(bits, AXIS, scatter_dimension=0, tiled=True)
        return _from_bits(out, x[: x.shape[0] // n])
    return lambda *xs: [one(x) for x in xs]


def _send(n: int, pairs: tuple[tuple[int, int], ...]):
    """Point to point: input i goes from pairs[i][0] to pairs[i][1] (both group ranks);
    the receiver gets it, every other rank its own input back."""
    def one(x, pair):
        src, dst = pair
        moved = _from_root(x, src)
        return jnp.where(lax.axis_index(AXIS) == dst, moved, x)
    return lambda *xs: [one(x, pair) for x, pair in zip(xs, pairs)]


_BODIES: dict[str, Callable] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "scatter": _scatter,
    "send": _send,
}
