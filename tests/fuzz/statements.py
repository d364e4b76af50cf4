"""The statements fuzz programs are made of: one small generator per kind, each drawing one
line of Python from the tensors defined so far (their CPU values say what is valid).

A generator takes hypothesis' `draw` and the `Env` of the program so far and returns a line,
or None where it does not apply. Valid arguments come first in every choice, so that a
failing program shrinks towards plain calls; invalid ones (a dim out of range, a shape that
does not broadcast) are drawn now and then, to compare the errors too.
"""

from __future__ import annotations

import math
import warnings

import torch
from hypothesis import strategies as st

DTYPES = ("float32", "int64", "bool", "float64", "complex64", "bfloat16", "float16", "int32",
          "uint8")
FLOATS = (0.0, 1.0, -1.0, 2.5, -0.5, 3.0, -2.0, 0.25)
VALUES = {
    "float": FLOATS,
    "int": (0, 1, -1, 2, -3, 4),
    "uint8": (0, 1, 2, 3, 250),
    "bool": (False, True),
    "complex": (0j, (1 + 1j), (-1 + 0.5j), 2j, (3 + 0j), (-0.5 - 2j)),
}
SCALARS = ("2", "-1", "0.5", "True", "-1.5", "3", "0", "(1+2j)", "False", "2.0")


def value_kind(dtype: str) -> str:
    if dtype == "bool" or dtype == "uint8":
        return dtype
    if dtype.startswith("complex"):
        return "complex"
    return "float" if dtype.startswith(("float", "bfloat")) else "int"


class Env:
    """A program being generated: its CPU namespace and its tensors' names, in order."""

    def __init__(self):
        self.ns: dict = {"torch": torch, "device": "cpu"}
        self.names: list[str] = []
        self.n_vars = 0
        self.grad = False  # some input requires grad

    def tensors(self, pred=None) -> list[str]:
        return [n for n in self.names if isinstance(self.ns.get(n), torch.Tensor)
                and (pred is None or pred(self.ns[n]))]

    def new_name(self) -> str:
        return f"v{self.n_vars}"

    def run(self, line: str, defines: str | None) -> None:
        """Run `line` on the CPU; a name it defines becomes a variable if it ran."""
        if defines is not None and defines.startswith("v"):
            self.n_vars += 1  # a name per statement, whether it runs or not
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(line, self.ns)
        except Exception:  # noqa: BLE001 - a line that raises is kept: errors are compared
            return
        if defines is not None and isinstance(self.ns.get(defines), torch.Tensor):
            self.names.append(defines)


# ------------------------------------------------------------------ drawing helpers
def _rarely(draw) -> bool:
    """True about one time in ten (an invalid argument); shrinks to False."""
    return draw(st.integers(0, 9)) == 9


def _pick(draw, env: Env, pred=None) -> str | None:
    names = env.tensors(pred)
    return draw(st.sampled_from(names)) if names else None


def _dim(draw, t: torch.Tensor, extra: int = 0) -> int:
    """A dim of `t` (of `t.dim() + extra` dims), negative or not; now and then out of range."""
    n = max(t.dim() + extra, 1)
    if _rarely(draw):
        return draw(st.sampled_from((n, -n - 1)))
    return draw(st.integers(-n, n - 1))


def _index(draw, size: int) -> int:
    if _rarely(draw) or size == 0:
        return draw(st.sampled_from((size, -size - 1)))
    return draw(st.integers(-size, size - 1))


def _scalar(draw) -> str:
    return draw(st.sampled_from(SCALARS))


def _zero_dim(draw) -> str:
    """A 0-dim tensor: a CPU scalar tensor (PyTorch lets it mix with any device's tensors),
    one on the program's device, or one of a low-precision dtype."""
    s = _scalar(draw)
    form = draw(st.sampled_from(("cpu", "device", "half")))
    if form == "cpu":
        return f"torch.tensor({s})"
    if form == "device":
        return f"torch.tensor({s}, device=device)"
    return f"torch.tensor({s}, dtype=torch.float16, device=device)"


def _operand(draw, env: Env) -> str:
    """The other operand of a binary op: a tensor, a Python number or a 0-dim tensor."""
    form = draw(st.sampled_from(("tensor", "scalar", "zero_dim")))
    if form == "tensor":
        return _pick(draw, env) or _scalar(draw)
    if form == "scalar":
        return _scalar(draw)
    return _zero_dim(draw)


def _size_of(t: torch.Tensor, d: int) -> int:
    return t.shape[d] if t.dim() and -t.dim() <= d < t.dim() else 1


def _shape_for(draw, numel: int) -> tuple[int, ...]:
    """A shape of `numel` elements (1 to 3 dims), now and then one of -1 or a wrong one."""
    if _rarely(draw):
        return (numel + 1,)
    if numel == 1 and draw(st.booleans()):
        return ()
    rank = draw(st.integers(1, 3))
    dims, rest = [], numel
    for _ in range(rank - 1):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0] if rest else [0, 1, 2]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest = rest // d if d else 0
    dims.append(rest if rest or 0 in dims else 0)
    if draw(st.booleans()) and any(dims):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
        if dims.count(-1) == 1 and 0 in dims:
            dims = [d if d != -1 else 1 for d in dims]
    return tuple(dims)


def _tuple(values) -> str:
    values = tuple(values)
    return f"({values[0]},)" if len(values) == 1 else str(values)


def _slice(draw, size: int) -> str:
    start = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    stop = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    step = draw(st.sampled_from((None, 2, 3, 1, -1) if _rarely(draw) else (None, 2, 3)))
    text = ("" if start is None else str(start)) + ":" + ("" if stop is None else str(stop))
    return text + ("" if step is None else f":{step}")


def _assign(draw, env: Env, expr: str, always: bool = False) -> tuple[str, str | None]:
    """`vN = expr`, or `expr` alone (an in-place op's return is checked where assigned)."""
    if always or draw(st.booleans()):
        name = env.new_name()
        return f"{name} = {expr}", name
    return expr, None


# ------------------------------------------------------------------ views
def _view(fn):
    """A statement defining a new variable from one existing tensor `t` named `x`."""
    def gen(draw, env: Env):
        x = _pick(draw, env)
        if x is None:
            return None
        expr = fn(draw, x, env.ns[x])
        return None if expr is None else _assign(draw, env, expr, always=True)
    gen.__name__ = fn.__name__
    return gen


@_view
def slicing(draw, x, t):
    if t.dim() == 0:
        return f"{x}[...]"
    d = draw(st.integers(0, t.dim() - 1))
    parts = [":"] * d + [_slice(draw, t.shape[d])]
    if draw(st.booleans()) and d + 1 < t.dim():
        parts.append(str(_index(draw, t.shape[d + 1])))
    return f"{x}[{', '.join(parts)}]"


@_view
def select(draw, x, t):
    if t.dim() == 0:
        return f"{x}.select(0, 0)"
    d = _dim(draw, t)
    return f"{x}.select({d}, {_index(draw, _size_of(t, d))})"


@_view
def transpose(draw, x, t):
    return f"{x}.transpose({_dim(draw, t)}, {_dim(draw, t)})"


@_view
def permute(draw, x, t):
    order = draw(st.permutations(range(t.dim())))
    if _rarely(draw):
        order = order[:-1] if order else [0]
    return f"{x}.permute({', '.join(map(str, order))})" if order else f"{x}.permute(())"


@_view
def transposed(draw, x, t):
    return draw(st.sampled_from((f"{x}.t()", f"{x}.mT", f"{x}.T")))


@_view
def expand(draw, x, t):
    sizes = []
    for n in t.shape:
        options = (1, 2, 3, -1, 0) if n == 1 else (n, -1, n + 1)
        sizes.append(draw(st.sampled_from(options)))
    new = draw(st.lists(st.integers(1, 3), max_size=2))
    return f"{x}.expand({', '.join(map(str, [*new, *sizes]))})" if new or sizes \
        else f"{x}.expand(())"


@_view
def as_strided(draw, x, t):
    storage = t.untyped_storage().nbytes() // t.element_size()
    rank = draw(st.integers(0, 3))
    size = [draw(st.integers(1, 3)) for _ in range(rank)]
    stride = [draw(st.integers(0, 4)) for _ in range(rank)]
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride))
    offset = draw(st.integers(0, max(storage - span, 0)))
    return f"{x}.as_strided({_tuple(size) if size else '()'}, " \
           f"{_tuple(stride) if stride else '()'}, {offset})"


@_view
def view(draw, x, t):
    if draw(st.integers(0, 4)) == 0:
        dtype = draw(st.sampled_from(DTYPES))
        return f"{x}.view(torch.{dtype})"
    shape = _shape_for(draw, t.numel())
    verb = draw(st.sampled_from(("view", "reshape")))
    return f"{x}.{verb}({_tuple(shape) if shape else '()'})"


@_view
def unsqueeze(draw, x, t):
    return f"{x}.unsqueeze({_dim(draw, t, extra=1)})"


@_view
def squeeze(draw, x, t):
    if draw(st.booleans()):
        return f"{x}.squeeze()"
    return f"{x}.squeeze({_dim(draw, t)})"


@_view
def diagonal(draw, x, t):
    if t.dim() < 2 and not _rarely(draw):
        return None
    offset = draw(st.integers(-2, 2))
    return f"{x}.diagonal({offset}, {_dim(draw, t)}, {_dim(draw, t)})"


@_view
def narrow(draw, x, t):
    d = _dim(draw, t)
    n = _size_of(t, d)
    start = draw(st.integers(-n, n))
    length = draw(st.integers(0, max(n - (start % n if n else 0), 0)))
    return f"{x}.narrow({d}, {start}, {length})"


@_view
def unfold(draw, x, t):
    d = _dim(draw, t)
    n = _size_of(t, d)
    return f"{x}.unfold({d}, {draw(st.integers(1, n + 1 if _rarely(draw) else max(n, 1)))}, " \
           f"{draw(st.integers(1, 3))})"


@_view
def flatten(draw, x, t):
    start = _dim(draw, t)
    return f"{x}.flatten({start}, {_dim(draw, t)})"


@_view
def chunk(draw, x, t):
    d = _dim(draw, t)
    verb = draw(st.sampled_from(("chunk", "split", "unbind", "tensor_split")))
    expr = f"{x}.unbind({d})" if verb == "unbind" else f"{x}.{verb}({draw(st.integers(1, 3))}, {d})"
    try:
        parts = len(eval(expr, {x: t}))
    except Exception:  # noqa: BLE001 - an invalid call: keep it, it raises
        return expr + "[0]"
    return f"{expr}[{_index(draw, parts)}]"


@_view
def complex_view(draw, x, t):
    return draw(st.sampled_from((f"{x}.real", f"{x}.imag", f"{x}.conj()",
                                 f"torch.view_as_real({x})", f"{x}.conj().imag",
                                 f"{x}.resolve_conj()")))


@_view
def movedim(draw, x, t):
    verb = draw(st.sampled_from(("movedim", "swapaxes")))
    return f"{x}.{verb}({_dim(draw, t)}, {_dim(draw, t)})"


@_view
def detach(draw, x, t):
    return draw(st.sampled_from((f"{x}.detach()", f"{x}.contiguous()", f"{x}.clone()",
                                 f"{x}.view_as({x})")))


VIEWS = (slicing, select, transpose, permute, transposed, expand, as_strided, view, unsqueeze,
         squeeze, diagonal, narrow, unfold, flatten, chunk, complex_view, movedim, detach)


# ------------------------------------------------------------------ in-place ops
def _in_place(fn):
    def gen(draw, env: Env):
        x = _pick(draw, env)
        if x is None:
            return None
        expr = fn(draw, x, env.ns[x], env)
        return None if expr is None else _assign(draw, env, expr)
    gen.__name__ = fn.__name__
    return gen


@_in_place
def arith_(draw, x, t, env):
    op = draw(st.sampled_from(("add_", "mul_", "sub_", "div_")))
    other = _operand(draw, env)
    extra = ""
    if op in ("add_", "sub_") and _rarely(draw):
        extra = f", alpha={draw(st.sampled_from(('2', '0.5', '-1')))}"
    if op == "div_" and draw(st.integers(0, 3)) == 0:
        extra = f", rounding_mode={draw(st.sampled_from(('floor', 'trunc')))!r}"
    return f"{x}.{op}({other}{extra})"


@_in_place
def copy_(draw, x, t, env):
    src = _pick(draw, env)
    if draw(st.integers(0, 3)) == 0:
        src = f"{src}.{draw(st.sampled_from(('t()', 'flip(0)', 'mT', 'conj()')))}"
    return f"{x}.copy_({src})"


@_in_place
def fill_(draw, x, t, env):
    form = draw(st.sampled_from(("fill", "zero", "fill0d")))
    if form == "zero":
        return f"{x}.zero_()"
    return f"{x}.fill_({_scalar(draw) if form == 'fill' else _zero_dim(draw)})"


@_in_place
def clamp_(draw, x, t, env):
    lo = draw(st.sampled_from(("-1", "None", "0.5", "0")))
    hi = draw(st.sampled_from(("2", "None", "1.5", "-2")))
    return f"{x}.clamp_({lo}, {hi})"


@_in_place
def unary_(draw, x, t, env):
    op = draw(st.sampled_from(("neg_", "abs_", "exp_", "floor_", "sqrt_", "sigmoid_",
                               "bitwise_not_", "logical_not_", "sign_", "round_")))
    return f"{x}.{op}()"


def _index_tensor(draw, t: torch.Tensor, d: int, cpu: bool = False) -> str:
    """Indices into dim `d` of `t`; `cpu`: on the CPU now and then (indexing, `t[i]` and
    index_put_, takes CPU indices into a tensor on any device; index_select does not)."""
    n = _size_of(t, d)
    k = draw(st.integers(1, 3))
    values = [_index(draw, n) for _ in range(k)]
    where = draw(st.sampled_from((", device=device", ""))) if cpu else ", device=device"
    return f"torch.tensor({values}{where})"


@_in_place
def index_put_(draw, x, t, env):
    if t.dim() == 0:
        return None
    idx = _index_tensor(draw, t, 0, cpu=True)
    values = draw(st.sampled_from(("torch.tensor(1.5, device=device)", "torch.tensor(2)")))
    if draw(st.booleans()):
        values = _pick(draw, env) or values
    acc = draw(st.booleans())
    return f"{x}.index_put_(({idx},), {values}, accumulate={acc})"


@_in_place
def masked_fill_(draw, x, t, env):
    mask = draw(st.sampled_from((f"{x} > 0", "mask")))
    if mask == "mask":
        mask = _pick(draw, env, lambda m: m.dtype == torch.bool) or f"{x} < 1"
    value = _scalar(draw) if draw(st.booleans()) else _zero_dim(draw)
    return f"{x}.masked_fill_({mask}, {value})"


def setitem(draw, env: Env):
    x = _pick(draw, env)
    if x is None:
        return None
    t = env.ns[x]
    form = draw(st.sampled_from(("slice", "index", "mask")))
    if form == "mask" or t.dim() == 0:
        target = f"{x} > 0" if form == "mask" else "..."
    elif form == "index":
        target = _index_tensor(draw, t, 0, cpu=True)
    else:
        target = _slice(draw, t.shape[0])
        if t.dim() > 1 and draw(st.booleans()):
            target += f", {_index(draw, t.shape[1])}"
    value = _operand(draw, env)
    return f"{x}[{target}] = {value}", None


@_in_place
def metadata_(draw, x, t, env):
    op = draw(st.sampled_from(("unsqueeze_", "squeeze_", "t_", "transpose_", "resize_",
                               "as_strided_")))
    if op == "unsqueeze_":
        return f"{x}.unsqueeze_({_dim(draw, t, extra=1)})"
    if op == "squeeze_":
        return f"{x}.squeeze_({_dim(draw, t)})"
    if op == "transpose_":
        return f"{x}.transpose_({_dim(draw, t)}, {_dim(draw, t)})"
    if op == "resize_":  # within the storage: elements past it would be uninitialized
        n = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()
        shape = [draw(st.integers(0, 4)) for _ in range(draw(st.integers(1, 2)))]
        while math.prod(shape) > n:
            shape = shape[1:] if len(shape) > 1 else [n]
        return f"{x}.resize_({_tuple(shape)})"
    if op == "as_strided_":
        n = t.untyped_storage().nbytes() // t.element_size()
        return f"{x}.as_strided_(({max(n // 2, 1)},), (1,), {min(n // 2, max(n - 1, 0))})"
    return f"{x}.t_()"


IN_PLACE = (arith_, copy_, fill_, clamp_, unary_, index_put_, masked_fill_, setitem, metadata_)


# ------------------------------------------------------------------ functional ops and out=
BINARY = ("{a} + {b}", "{a} * {b}", "{a} - {b}", "{a} / {b}", "{a} // {b}", "{a} % {b}",
          "{a} ** {b}", "{a} < {b}", "{a} == {b}", "{a} & {b}", "torch.maximum({a}, {b})",
          "torch.where({a} > 0, {a}, {b})", "torch.add({a}, {b}, alpha=2)",
          "torch.div({a}, {b}, rounding_mode='trunc')", "{b} - {a}", "torch.atan2({a}, {b})")
UNARY = ("-{a}", "{a}.abs()", "{a}.exp()", "{a}.sqrt()", "{a}.float()", "{a}.long()",
         "{a}.bool()", "{a}.to(torch.bfloat16)", "{a}.to(torch.complex64)", "{a}.sum()",
         "{a}.sum({d}, keepdim=True)", "{a}.mean({d})", "{a}.amax({d})", "{a}.cumsum({d})",
         "{a}.flip({d})", "{a}.roll(1, {d})", "{a}.sum(dtype=torch.int32)", "{a}.sign()",
         "{a}.prod()", "{a}.argmax()", "{a}[{a} > 0]", "{a}.nonzero()", "{a}.sort({d})[0]",
         "{a}.tril()", "{a}.repeat(2, 1)", "{a}.norm()", "{a}.var()")


def binary(draw, env: Env):
    a = _pick(draw, env)
    if a is None:
        return None
    text = draw(st.sampled_from(BINARY))
    return _assign(draw, env, text.format(a=a, b=_operand(draw, env)), always=True)


def unary(draw, env: Env):
    a = _pick(draw, env)
    if a is None:
        return None
    text = draw(st.sampled_from(UNARY))
    expr = text.format(a=a, d=_dim(draw, env.ns[a]) if "{d}" in text else 0)
    return _assign(draw, env, expr, always=True)


def multi(draw, env: Env):
    a, b = _pick(draw, env), _pick(draw, env)
    if a is None:
        return None
    d = _dim(draw, env.ns[a])
    text = draw(st.sampled_from(("torch.cat([{a}, {b}], {d})", "torch.stack([{a}, {b}], {d})",
                                 "{a} @ {b}", "{a}.expand_as({b})", "{a}.index_select({d}, {i})",
                                 "{a}[{i}]", "torch.broadcast_tensors({a}, {b})[0]")))
    indexing = text == "{a}[{i}]"  # dim 0, with indices on the CPU now and then
    i = _index_tensor(draw, env.ns[a], 0 if indexing else d, cpu=indexing)
    return _assign(draw, env, text.format(a=a, b=b, d=d, i=i), always=True)


OUT = ("torch.add({a}, {b}, out={o})", "torch.mul({a}, {b}, out={o})",
       "torch.neg({a}, out={o})", "torch.sum({a}, {d}, out={o})",
       "torch.cat([{a}, {a}], out={o})", "torch.clamp({a}, 0, out={o})",
       "torch.abs({a}, out={o})", "torch.matmul({a}, {a}, out={o})",
       "torch.where({a} > 0, {a}, {b}, out={o})", "torch.div({a}, {b}, out={o})",
       "torch.exp({a}, out={o})", "torch.lt({a}, {b}, out={o})")
UNCHECKED_OUT = ("torch.sum({a}, {d}, out={o})", "torch.matmul({a}, {a}, out={o})")


def out(draw, env: Env):
    """An op writing into out=: an existing tensor (of any shape and dtype, an input's
    alias too) or a fresh empty one."""
    a = _pick(draw, env)
    if a is None:
        return None
    text = draw(st.sampled_from(OUT))
    b = _operand(draw, env)
    o = None
    if draw(st.booleans()):
        # PyTorch checks that an elementwise op's out= does not partly overlap an input;
        # a reduction or product writing over its input is undefined: not drawn.
        used = {_storage(env, n) for n in (a, b)} if text in UNCHECKED_OUT else set()
        o = _pick(draw, env, lambda t: t.untyped_storage()._cdata not in used)
    if o is None:
        o = f"torch.empty(0, dtype=torch.{draw(st.sampled_from(DTYPES))}, device=device)"
    expr = text.format(a=a, b=b, o=o, d=_dim(draw, env.ns[a]))
    return _assign(draw, env, expr)


def _storage(env: Env, name: str):
    t = env.ns.get(name)
    return t.untyped_storage()._cdata if isinstance(t, torch.Tensor) else None


FUNCTIONAL = (binary, unary, multi, out)


# ------------------------------------------------------------------ autograd
def backward(draw, env: Env):
    x = _pick(draw, env, lambda t: t.requires_grad) or _pick(draw, env)
    if x is None:
        return None
    form = draw(st.sampled_from(("{x}.sum().backward()", "{x}.abs().sum().backward()",
                                 "{x}.backward(torch.ones_like({x}))",
                                 "({x} * {x}).sum().backward(retain_graph=True)")))
    return form.format(x=x), None


def retain_grad(draw, env: Env):
    x = _pick(draw, env, lambda t: t.requires_grad and not t.is_leaf) or _pick(draw, env)
    return None if x is None else (f"{x}.retain_grad()", None)


def requires_grad_(draw, env: Env):
    x = _pick(draw, env)
    return None if x is None else (f"{x}.requires_grad_()", None)


def no_grad(draw, env: Env):
    x = _pick(draw, env)
    if x is None:
        return None
    return f"with torch.no_grad(): {x}.mul_({_scalar(draw)})", None


def grad(draw, env: Env):
    x = _pick(draw, env, lambda t: t.requires_grad)
    leaf = _pick(draw, env, lambda t: t.is_leaf and t.requires_grad)
    if x is None or leaf is None:
        return None
    return _assign(draw, env, f"torch.autograd.grad({x}.sum(), [{leaf}], allow_unused=True)[0]",
                   always=True)


AUTOGRAD = (backward, retain_grad, requires_grad_, no_grad, grad)
AUTOGRAD_LINES = ("backward(", "retain_grad(", "requires_grad_(", "torch.autograd.")

# Drawn by family first (views and in-place ops twice as often as the rest), then by kind.
FAMILIES = (VIEWS, IN_PLACE, VIEWS, IN_PLACE, FUNCTIONAL, AUTOGRAD)
