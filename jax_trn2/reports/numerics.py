"""Numerics reports: how far results on the simulated Trainium2 are from a reference.

    report = jax_trn2.numerics.compare(step, a, b)   # runs step on trn2 and on CPU JAX
    print(report)                                     # one row per output leaf

`compare` runs a function through `jax_trn2.jit` and through `jax.jit` on CPU JAX and reports,
per output leaf: dtype, shape, the largest absolute error, the largest error in ULPs of the
output dtype at the scale of the output (its largest reference magnitude; the largest ULP
error at each element's own reference value is a detail below the table, as it explodes
where the reference is zero or tiny), how many elements are bit-exact, and where the largest
absolute error is.
`report` does the same for any two pytrees (say an FP8 result against a BF16 one, or against
a float64 reference). From the shell: `jax-trn2 compare script.py:function`.

A function over a `jax_trn2.make_mesh()` mesh runs unchanged on CPU JAX: the mesh's devices
are host CPU devices (one per chip), so jax.jit runs the same program on them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import jax
import ml_dtypes
import numpy as np
from jax import tree_util
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax._src.sharding_impls import GSPMDSharding

from jax_trn2.frontend.jit import Jitted, jit
from lowering.host import host_devices
from mesh import dtypes



@dataclass(frozen=True)
class LeafReport:
    """How one output leaf compares. Errors are |got - want|; `max_ulp_error`, the headline,
    is the largest in ULPs of `dtype` (the checked result's type) at the leaf's largest
    finite reference magnitude, so that results near zero (of cancelling sums, say) do not
    dominate it; `max_ulp_error_per_element` is the largest in ULPs at each element's own
    reference value, which is huge where the reference is zero or tiny (the ULP at 0 is the
    smallest subnormal). NaN against NaN counts as exact; a non-finite value against
    anything else is an infinite error."""

    path: str  # the leaf's place in the output pytree, e.g. "[0]['w']"; "" for a lone array
    dtype: str
    shape: tuple[int, ...]
    differing: int  # elements that are not bit-exact
    max_abs_error: float
    max_ulp_error: float  # ULPs of dtype at the leaf's largest finite |reference|
    max_ulp_error_per_element: float  # ULPs of dtype at each element's own |reference|
    worst_index: tuple[int, ...] | None  # the largest absolute error; None when all exact
    got_at_worst: float | complex | None
    want_at_worst: float | complex | None
    worst_index_per_element: tuple[int, ...] | None  # the largest per-element ULP error

    @property
    def size(self) -> int:
        """The number of elements."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def exact_fraction(self) -> float:
        """The fraction of elements that are bit-exact (1.0 for an empty leaf)."""
        return 1.0 - self.differing / self.size if self.size else 1.0


@dataclass(frozen=True, repr=False)
class NumericsReport:
    """Per-leaf comparison of a result (`got_label`) with a reference (`want_label`); its
    text (str, and repr, so that a REPL shows `compare(f, x)` as the table) is the table
    followed by what its ULPs are measured against."""

    leaves: tuple[LeafReport, ...]
    got_label: str = "trn2"
    want_label: str = "reference"
    where: str = ""  # where each side ran, for the header

    def __str__(self) -> str:
        header = ("output", "dtype", "shape", "bit-exact", "differing", "max abs err",
                  "max ulp err", "worst at", self.got_label, self.want_label)
        rows = [header] + [_row(leaf) for leaf in self.leaves]
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [f"numerics: {self.got_label} vs {self.want_label}" +
                 (f" ({self.where})" if self.where else "")]
        lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(f"max ulp err: |error| in ulps of the output's dtype at its largest "
                     f"|{self.want_label}| value; worst at: the largest absolute error")
        details = [f"{leaf.path or 'out'} up to {leaf.max_ulp_error_per_element:.4g} at "
                   f"{leaf.worst_index_per_element}"
                   for leaf in self.leaves if leaf.worst_index_per_element is not None]
        if details:
            lines.append(f"per element, in ulps at each element's own |{self.want_label}| "
                         f"value (large where it is zero or tiny): {'; '.join(details)}")
        return "\n".join(lines)

    __repr__ = __str__


def _row(leaf: LeafReport) -> tuple[str, ...]:
    worst = "-" if leaf.worst_index is None else str(tuple(leaf.worst_index))
    value = (lambda v: "-" if v is None else f"{v:.6g}")
    return (leaf.path or "out", leaf.dtype, f"[{','.join(map(str, leaf.shape))}]",
            percent(leaf.size - leaf.differing, leaf.size),
            f"{leaf.differing:,} of {leaf.size:,}", f"{leaf.max_abs_error:.4g}",
            f"{leaf.max_ulp_error:.4g}", worst, value(leaf.got_at_worst),
            value(leaf.want_at_worst))


def percent(count: int, total: int) -> str:
    """count / total as a percentage with two decimals, or as many more as it takes not to
    show 0% or 100% for a fraction that is neither (1 of 32,768 is 0.003%, not 0.00%)."""
    if not total:
        return "-"
    percentage = 100 * count / total
    decimals = 2
    while 0 < count < total and round(percentage, decimals) in (0, 100):
        decimals += 1
    return f"{percentage:.{decimals}f}%"


def ulp(x: Any, dtype: Any) -> np.ndarray:
    """The spacing of `dtype`'s values at |x| (float64): 2**(max(e, emin) - mantissa bits)
    for |x| in [2**e, 2**(e+1)), the smallest subnormal at 0; 1 for integers and bools. For
    a complex type, the spacing of its parts' type at the magnitude |x|."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        dtype = np.finfo(dtype).dtype
    x = np.abs(np.asarray(x)).astype(np.float64)
    if not dtypes.is_float(dtype.name):
        return np.ones_like(x)
    info = ml_dtypes.finfo(dtype)
    _, exponent = np.frexp(x)  # x = m * 2**exponent with m in [0.5, 1)
    exponent = np.where(x > 0, np.maximum(exponent - 1, info.minexp), info.minexp)
    return np.ldexp(1.0, exponent - info.nmant)


def report(got: Any, want: Any, *, got_label: str = "trn2", want_label: str = "reference",
           where: str = "") -> NumericsReport:
    """Compare two pytrees of arrays of the same structure and shapes, leaf by leaf; ULPs
    are those of each `got` leaf's dtype (the reference may be wider, e.g. float64).
    `where`, if given, says in the header where each side ran."""
    got_leaves, got_tree = tree_util.tree_flatten_with_path(got)
    want_leaves, want_tree = tree_util.tree_flatten(want)
    if got_tree != want_tree:
        raise ValueError(f"result structure {got_tree} differs from the reference's "
                         f"{want_tree}")
    return NumericsReport(tuple(_compare_leaf(tree_util.keystr(path), np.asarray(g),
                                              np.asarray(w))
                                for (path, g), w in zip(got_leaves, want_leaves)),
                          got_label, want_label, where)


def _compare_leaf(path: str, got: np.ndarray, want: np.ndarray) -> LeafReport:
    if got.shape != want.shape:
        raise ValueError(f"output {path or 'out'}: shape {got.shape} differs from the "
                         f"reference's {want.shape}")
    # complex128 keeps both parts of complex values; float64 holds every other type's values.
    wide = np.complex128 if np.iscomplexobj(got) or np.iscomplexobj(want) else np.float64
    g, w = got.astype(wide), want.astype(wide)
    both_nan = np.isnan(g) & np.isnan(w)
    if got.dtype == want.dtype:  # bit patterns, so that -0 against +0 is not exact
        exact = _same_bits(got, want) | both_nan
    else:
        exact = (g == w) | both_nan
    with np.errstate(invalid="ignore", over="ignore"):
        abs_error = np.where(exact, 0.0, _abs_difference(got, want, g, w))
        abs_error = np.where(np.isnan(abs_error), np.inf, abs_error)
        ulps = abs_error / ulp(np.where(np.isfinite(w), w, 0.0), got.dtype)
    if exact.all():  # also an empty leaf
        return LeafReport(path, got.dtype.name, got.shape, 0, 0.0, 0.0, 0.0, None, None, None,
                          None)
    finite = np.abs(w[np.isfinite(w)])
    scale_ulp = ulp(finite.max() if finite.size else 0.0, got.dtype)
    worst = _index(np.argmax(np.where(exact, -1.0, abs_error)), got.shape)
    worst_per_element = _index(np.argmax(np.where(exact, -1.0, ulps)), got.shape)
    value = complex if wide is np.complex128 else float
    return LeafReport(path, got.dtype.name, got.shape, int(exact.size - exact.sum()),
                      float(abs_error[worst]), float(abs_error[worst] / scale_ulp),
                      float(ulps[worst_per_element]), worst, value(g[worst]), value(w[worst]),
                      worst_per_element)


def _index(flat: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(flat), shape))


def _same_bits(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Elementwise: the same bit pattern (of each part, for complex values)."""
    if np.iscomplexobj(got):
        return _same_bits(got.real, want.real) & _same_bits(got.imag, want.imag)
    bits = f"u{got.dtype.itemsize}"
    return got.view(bits) == want.view(bits)


def _abs_difference(got: np.ndarray, want: np.ndarray, g: np.ndarray,
                    w: np.ndarray) -> np.ndarray:
    """|got - want| as float64: of integers, their exact difference (rounded once; 64-bit
    integers that differ in their low bits are equal in float64); of complex values, the
    magnitude of the difference; 0 between equal values (an infinity and itself)."""
    wide_ints = np.issubdtype(got.dtype, np.integer) and np.issubdtype(want.dtype, np.integer) \
        and max(got.dtype.itemsize, want.dtype.itemsize) == 8
    if not wide_ints:  # narrower integers are exact in float64
        return np.where(g == w, 0.0, np.abs(g - w))
    difference = np.zeros(got.shape)  # of the same shape (_compare_leaf checks)
    differ = got != want  # exactly, in Python integers, where they differ only
    difference[differ] = np.abs(got[differ].astype(object) - want[differ].astype(object))
    return difference


def compare(fun: Callable, *args, **kwargs) -> NumericsReport:
    """Run `fun(*args, **kwargs)` on the simulated mesh and on CPU JAX, and report how the
    results differ, per output leaf.

    `fun` is a plain function (jitted here with jax_trn2.jit and jax.jit) or a
    `jax_trn2.jit` function, whose static arguments and rounding mode are kept: compare
    `jax_trn2.jit(f, rounding="stochastic", seed=0)` to see stochastic rounding.

    The reference is always XLA:CPU, wherever the arguments live: arguments on trn2
    devices (`jax.devices("trn2")`) are copied to host CPU devices with the same sharding
    (trn2 device i as host device i), and the function is lowered for the CPU, so a mesh
    of trn2 devices it closes over (a shard_map's, a sharding constraint's) runs on those
    host devices too. The report's header says where each side ran.
    """
    simulated = fun if isinstance(fun, Jitted) else jit(fun)
    lowered = simulated.lower(*args, **kwargs)  # compiled once; its program gives the mesh
    dyn_args, dyn_kwargs = simulated.dynamic_arguments(args, kwargs)
    got = lowered.compile()(*dyn_args, **dyn_kwargs)
    want = _on_cpu(simulated, args, kwargs)
    simulated_devices = _count(lowered.program.mesh.num_devices, "simulated device")
    host_devices_used = _count(len(_devices_of(want)), "host CPU device")
    return report(got, want, got_label="trn2", want_label="XLA:CPU",
                  where=f"trn2: jax_trn2's simulator on {simulated_devices}, rounding "
                        f"{simulated.rounding}; XLA:CPU: jax on {host_devices_used}")


def _on_cpu(simulated: Jitted, args: tuple, kwargs: dict) -> Any:
    """The function of `simulated` (as jax.jit has it, static arguments and all) run by
    XLA:CPU on the arguments moved to host CPU devices. Lowered for the CPU through
    jax.export, which also moves the meshes the function closes over; jax.export cannot
    hold host callbacks, so a function with any runs as jax.jit runs it on the moved
    arguments (then a non-CPU mesh inside it is an error, not a silent self-comparison)."""
    reference = simulated.jax_function
    args, kwargs = tree_util.tree_map(_on_host, (args, kwargs))
    dynamic = simulated.dynamic_arguments(args, kwargs)
    try:
        exported = jax.export.export(reference, platforms=("cpu",))(*args, **kwargs)
    except NotImplementedError as e:
        if "host_callbacks" not in str(e):
            raise
        dyn_args, dyn_kwargs = _placed_on(dynamic, 1)
        want = reference(*dyn_args, **dyn_kwargs)
    else:
        dyn_args, dyn_kwargs = _placed_on(dynamic, exported.nr_devices)
        want = jax.jit(exported.call)(*dyn_args, **dyn_kwargs)
    elsewhere = sorted({d.platform for d in _devices_of(want)} - {"cpu"})
    if elsewhere:
        raise ValueError(
            f"numerics.compare: the CPU reference ran on {', '.join(elsewhere)} devices: the "
            "function puts values on them itself (a mesh of jax.devices('trn2') it closes "
            "over, a device_put), and has host callbacks, which keep jax.export from moving "
            "it to the CPU. Build its mesh from the arguments' (jax.typeof(x).sharding) or "
            "with jax_trn2.make_mesh, whose devices run on both sides.")
    return want


def _placed_on(arguments: Any, num_devices: int) -> Any:
    """Arguments on host CPU devices (_on_host) with the rest (NumPy arrays, Python
    scalars, uncommitted arrays) replicated over the devices the others are on, else over
    `num_devices` host devices (a program exported for that many needs them)."""
    placed = {d for leaf in tree_util.tree_leaves(arguments)
              if isinstance(leaf, jax.Array) and leaf.committed for d in leaf.sharding.device_set}
    devices = sorted(placed, key=lambda d: d.id) if placed else \
        host_devices(num_devices) if num_devices > 1 else jax.devices("cpu")[:1]
    # (not a NamedSharding: jax would look for the program's result shardings on its mesh)
    replicated = GSPMDSharding.get_replicated(devices)
    return tree_util.tree_map(
        lambda leaf: leaf if isinstance(leaf, jax.Array) and leaf.committed
        else jax.device_put(leaf, replicated), arguments)


def _on_host(leaf: Any) -> Any:
    """A jax.Array on non-CPU devices, copied to the host CPU devices of the same ids (of
    a host client with as many devices as the leaf's client) with the same sharding;
    anything else as it is."""
    if not isinstance(leaf, jax.Array) or \
            all(d.platform == "cpu" for d in leaf.sharding.device_set):
        return leaf
    sharding = leaf.sharding
    hosts = host_devices(len(next(iter(sharding.device_set)).client.devices()))
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        on_host = Mesh(np.vectorize(lambda d: hosts[d.id], otypes=[object])(mesh.devices),
                       mesh.axis_names, axis_types=mesh.axis_types)
        target = NamedSharding(on_host, sharding.spec)
    elif isinstance(sharding, SingleDeviceSharding):
        target = SingleDeviceSharding(hosts[next(iter(sharding.device_set)).id])
    else:
        target = GSPMDSharding(tuple(hosts[d.id] for d in sharding._device_assignment),
                               sharding._to_xla_hlo_sharding(leaf.ndim))
    return jax.device_put(np.asarray(leaf), target)


def _devices_of(tree: Any) -> set:
    return {d for leaf in tree_util.tree_leaves(tree) if isinstance(leaf, jax.Array)
            for d in leaf.sharding.device_set}


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
