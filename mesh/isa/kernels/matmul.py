"""dot_general on the Tensor Engine.

Model (nki.isa.nc_matmul; mesh/machine/trn2_facts.md): the PE array multiplies BF16/FP16/FP8
inputs exactly and sums a pass of up to 128 contraction elements in FP32; passes accumulate
into an FP32 PSUM tile one after another; the result is rounded once to the output type.
Here each pass is one host matmul with FP32 accumulation, and passes are added in order.
BF16 and FP8 inputs go to the host as BF16 (every FP8 value is a BF16 value), so that CPUs
with BF16 dot instructions run them at their BF16 rate; a product of two BF16 values fits
FP32's 24-bit significand, so products are exact either way. Other float inputs go as FP32.
(Host BF16 dot instructions flush subnormal sums to zero; a product that small is below
FP32's normal range and lost in any FP32 sum with a normal value.) Integer inputs accumulate
exactly in their integer output type.

A float matmul of BF16 or FP32 host operands runs, on a CPU executor device, in the
native pass loop (mesh.isa.kernels.native), which gives the same bits on every host CPU
and for every part of the product a device or process computes (a single pass too: a host
GEMM's order depends on its shape); the XLA loop of host GEMMs (_looped_passes), whose
sums' order depends on the host's GEMM kernels, runs only what the native loop does not
take: other host types (FP64) and executor devices that are not CPUs. The native loop rounds a
BF16 result to nearest even itself (a matmul's own, or the conversion to BF16 of an FP32
product nothing else uses: converts_native_matmul), bit for bit as XLA:CPU would.

Mesh dims: a mesh axis along which both operands vary is a batch dim, one along which only
one operand varies is a free dim of that operand, and one along which neither varies is not
computed at all (the product is replicated there).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec

from mesh import dtypes, isa, numerics, sharding
from mesh.isa.kernels import native, views
from mesh.isa.kernels.registry import kernel
from mesh.isa.kernels.context import KernelContext


def _mesh_dims(lhs_shape, rhs_shape, nm: int) -> tuple[list[int], list[int], list[int]]:
    """The mesh axes both operands vary along, only the left one, only the right one."""
    both = [a for a in range(nm) if lhs_shape[a] > 1 and rhs_shape[a] > 1]
    lhs_only = [a for a in range(nm) if lhs_shape[a] > 1 and rhs_shape[a] == 1]
    rhs_only = [a for a in range(nm) if rhs_shape[a] > 1 and lhs_shape[a] == 1]
    return both, lhs_only, rhs_only


@kernel(isa.Matmul)
def matmul(instr: isa.Matmul, args, ctx: KernelContext):
    lhs, rhs = args
    if runs_natively(instr, ctx.program, ctx.on_cpu):
        return [_native_matmul(lhs, rhs, instr, ctx)]
    return [_gemm_matmul(lhs, rhs, instr, ctx)]


def runs_natively(instr: isa.Matmul, program: isa.Program, on_cpu: bool) -> bool:
    """Whether a matmul runs in the native loop (mesh.isa.kernels.native; any CPU: it gives
    the same bits on each, whatever part of the product a process computes), its operands
    and result in the executor's layouts: on CPU executor devices (`on_cpu`); on others it
    runs as host GEMMs."""
    if not on_cpu:
        return False
    lhs, rhs = (program.values[v].type for v in instr.ins)
    if not dtypes.is_float(instr.out_dtype) or instr.out_dtype in dtypes.COMPLEX_PARTS:
        return False
    return native.runs(_host_dtype(dtypes.storage_dtype(lhs.dtype),
                                   dtypes.storage_dtype(rhs.dtype)))


def _native_matmul(lhs, rhs, instr: isa.Matmul, ctx: KernelContext, value: int | None = None,
                   out_dtype: str | None = None):
    """The matmul in the native loop, reading each operand where it is (_operands) and
    writing the result in its layout: one array, or a PerChip where the program returns it
    so (KernelContext.per_chip) and each chip's piece can be a buffer of its own
    (_tiles_within_chips). Over several executor devices each computes its slice
    of the result along the first mesh axis the result varies along that they divide
    (jax.shard_map): XLA's partitioner cannot split the custom call, and would gather the
    operands to every device for all of the matmul. `value` and `out_dtype`: the value it
    makes and its element type, where it makes a conversion of its product
    (native_matmul_converted); else the matmul's own."""
    value = instr.outs[0] if value is None else value
    out_dtype = out_dtype or instr.out_dtype
    written = _written_dtype(out_dtype, ctx.rounding)
    mesh_dims = _mesh_dims(lhs.shape, rhs.shape, ctx.nm)
    product = functools.partial(_native_product, instr=instr, nm=ctx.nm, mesh_dims=mesh_dims,
                                out_dtype=written)
    layout = ctx.out_shape(instr)
    if value in ctx.per_chip and written == dtypes.numpy_dtype(out_dtype) and \
            ctx.program.array_shape(value) == layout and \
            _tiles_within_chips(instr, lhs, rhs, layout, ctx):
        # each chip's result (as the loop writes it: nothing to round after) in a buffer of
        # its own
        parts = product(*_operands(instr, lhs, rhs, ctx),
                        parts=int(np.prod(layout[:ctx.nm], dtype=np.int64)))
        return sharding.PerChip([p.reshape(layout[ctx.nm:]) for p in parts], layout)
    devices = 1 if ctx.executor is None else ctx.executor.size
    axis = next((a for a in sorted(sum(mesh_dims, [])) if devices > 1
                 and max(lhs.shape[a], rhs.shape[a]) % devices == 0), None)
    if axis is None:
        acc = product(*_operands(instr, lhs, rhs, ctx))[0]
    else:
        def split(ndim, along):  # the spec of an array split along mesh axis `axis` or not
            return PartitionSpec(*("executor" if along and d == axis else None
                                   for d in range(ndim)))

        acc = jax.shard_map(lambda lhs, rhs: product(native.Strided.of(lhs),
                                                     native.Strided.of(rhs))[0],
                            mesh=ctx.executor,
                            in_specs=(split(lhs.ndim, lhs.shape[axis] > 1),
                                      split(rhs.ndim, rhs.shape[axis] > 1)),
                            out_specs=split(ctx.nm, True))(lhs, rhs)
    return numerics.round_to(acc, out_dtype, ctx.rounding).reshape(layout)


def _written_dtype(out_dtype: str, rounding) -> np.dtype:
    """The type the native loop writes a result of `out_dtype` in: BF16 where it is
    rounded to nearest even (`rounding` None), which the loop does as XLA:CPU's conversion
    would, tile by tile, with no FP32 result in memory; else FP32, rounded after."""
    nearest_bf16 = out_dtype == "bfloat16" and rounding is None
    return np.dtype(jnp.bfloat16 if nearest_bf16 else jnp.float32)


def native_matmul_converted(convert: isa.Elementwise, made: tuple,
                            ctx: KernelContext) -> jax.Array:
    """The conversion `convert` of a matmul's product, made by the matmul in the native
    loop (`made`: the matmul and its arguments; where converts_native_matmul says so)."""
    instr, (lhs, rhs) = made
    return _native_matmul(lhs, rhs, instr, ctx, value=convert.outs[0],
                          out_dtype=ctx.out_info(convert).type.dtype)


def converts_native_matmul(convert: isa.Instruction, made_by: isa.Instruction,
                           program: isa.Program, uses: dict[int, int], on_cpu: bool,
                           nearest: bool) -> bool:
    """Whether `convert`, an instruction of a value `made_by` made, is that instruction
    rounding its product as the native loop writes it (native_matmul_converted): where it
    converts to BF16, rounding to nearest even (`nearest`: stochastic rounding numbers its
    sites in program order), the FP32 product of a matmul in the native loop (`on_cpu`: the
    executor's devices are CPUs) that nothing else uses (`uses`: of each value in
    `program`). The product then never goes through memory in FP32, as on the Tensor
    Engine, whose PSUM tiles are rounded as they are copied out; the matmul's own result is
    unused, and XLA drops it."""
    return isinstance(convert, isa.Elementwise) and convert.op == "convert" and nearest and \
        isinstance(made_by, isa.Matmul) and made_by.out_dtype == "float32" and \
        program.values[convert.outs[0]].type.dtype == "bfloat16" and \
        runs_natively(made_by, program, on_cpu) and uses.get(convert.ins[0]) == 1


def _tiles_within_chips(instr: isa.Matmul, lhs, rhs, layout: tuple[int, ...],
                        ctx: KernelContext) -> bool:
    """Whether the native loop can write the product one array per chip: the product
    varies along the mesh axes its value's `layout` does, and each tile's columns are one
    chip's (the loop's columns run over the chips along the mesh axes only rhs varies
    along, each chip's columns in turn: their count must be a multiple of a tile's)."""
    nm = ctx.nm
    if layout[:nm] != tuple(max(l, r) for l, r in zip(lhs.shape[:nm], rhs.shape[:nm])):
        return False
    rhs_only = _mesh_dims(lhs.shape, rhs.shape, nm)[2]
    columns = int(np.prod([rhs.shape[nm + d] for d in _free_dims(
        rhs.ndim - nm, instr.rhs_batch, instr.rhs_contract)], dtype=np.int64))
    return not rhs_only or columns % native.TILE_COLUMNS == 0


def _operands(instr: isa.Matmul, lhs, rhs,
              ctx: KernelContext) -> tuple[native.Strided, native.Strided]:
    """The operands as the native loop reads them on one executor device: an operand a
    Shard made is read where the Shard's input holds its elements (views.shard_strides; for
    the left one, where its contraction is one contiguous run there), not from the Shard's
    copy, which XLA then drops (tens of MiB a call for the benchmark's small matmuls); any
    other operand as it is."""
    k_dims = [ctx.nm + d for d in instr.lhs_contract]
    return _in_place(instr.ins[0], lhs, ctx, k_dims), _in_place(instr.ins[1], rhs, ctx, [])


def _in_place(value: int, x, ctx: KernelContext, run: list[int]) -> native.Strided:
    """Operand `value` (array x) read from the input of the Shard that made it, where the
    dims `run` are one contiguous run there; else x."""
    made = ctx.made_by.get(value)
    if made is None or not isinstance(made[0], isa.Shard):
        return native.Strided.of(x)
    source = made[1][0]
    view = native.Strided(source, tuple(x.shape),
                          views.shard_strides(made[0], source.shape, ctx))
    return view if view.is_run(run) else native.Strided.of(x)


def native_matmul_placed(instr: isa.Matmul, args, ctx: KernelContext,
                         placement: native.Placement) -> jax.Array | None:
    """The matmul's result, rounded to nearest even, written by the native loop on one
    executor device straight into the array a data movement of it makes (`placement`:
    where each element of its executor layout goes there; movement.unshard_places_matmul
    says when); None where its product's layout is not the one placed."""
    lhs, rhs = args
    acc = _native_product(*_operands(instr, lhs, rhs, ctx), instr, ctx.nm,
                          _mesh_dims(lhs.shape, rhs.shape, ctx.nm), placement,
                          out_dtype=_written_dtype(instr.out_dtype, None))
    return None if acc is None else numerics.round_to(acc[0], instr.out_dtype)


def _native_product(lhs: native.Strided, rhs: native.Strided, instr: isa.Matmul, nm: int,
                    mesh_dims, placement: native.Placement | None = None,
                    parts: int = 1, out_dtype=jnp.float32) -> list[jax.Array] | None:
    """_native_matmul's FP32 sums, or those rounded to nearest even BF16 (`out_dtype`), of
    operands split along mesh axes or not: `mesh_dims` (_mesh_dims) of the whole operands;
    in the product's own layout, or where `placement` puts each of its elements (None if
    the product's layout is not the one `placement` is for); as `parts` arrays of blocks
    of its leading dims (native.pass_matmul)."""
    both, lhs_only, rhs_only = mesh_dims
    host = _host_dtype(lhs.array.dtype, rhs.array.dtype)
    lhs_free = [nm + d for d in _free_dims(len(lhs.shape) - nm, instr.lhs_batch,
                                           instr.lhs_contract)]
    rhs_free = [nm + d for d in _free_dims(len(rhs.shape) - nm, instr.rhs_batch,
                                           instr.rhs_contract)]
    lhs_batch, rhs_batch = ([nm + d for d in b] for b in (instr.lhs_batch, instr.rhs_batch))
    lhs_k, rhs_k = ([nm + d for d in c] for c in (instr.lhs_contract, instr.rhs_contract))
    out = (tuple(lhs.shape[a] if a in both + lhs_only else rhs.shape[a] if a in rhs_only
                 else 1 for a in range(nm))
           + tuple(lhs.shape[d] for d in lhs_batch + lhs_free)
           + tuple(rhs.shape[d] for d in rhs_free))
    lhs = _contraction_contiguous(lhs, lhs_k)
    if placement is None:
        placement = native.Placement(out, native.row_major(out), out)
    elif placement.layout != out:
        return None
    local = iter(range(nm, len(out)))
    out_batch, out_rows, out_cols = ([next(local) for _ in dims]
                                     for dims in (lhs_batch, lhs_free, rhs_free))
    return native.pass_matmul(
        lhs.array.astype(host), rhs.array.astype(host), instr.pass_size,
        [native.offsets(lhs.shape, dims, lhs.strides)
         for dims in (both + lhs_batch, lhs_only + lhs_free)],
        [native.offsets(rhs.shape, dims, rhs.strides)
         for dims in (both + rhs_batch, rhs_k, rhs_only + rhs_free)],
        [native.offsets(out, dims, placement.strides)
         for dims in (both + out_batch, lhs_only + out_rows, rhs_only + out_cols)],
        placement.shape, parts=parts, out_dtype=out_dtype)


def _contraction_contiguous(x: native.Strided, k_dims: list[int]) -> native.Strided:
    """x, whose contraction dims `k_dims` the native loop reads as one contiguous run: as
    it is where they are one (an operand in place, _operands), else a copy with them last,
    in order."""
    if x.is_run(k_dims):
        return x
    assert x.array.shape == x.shape, "a view is taken only where its contraction is a run"
    order = [d for d in range(len(x.shape)) if d not in k_dims] + k_dims
    moved = native.row_major([x.shape[d] for d in order])
    return native.Strided(lax.transpose(x.array, order), x.shape,
                          tuple(moved[order.index(d)] for d in range(len(x.shape))))


def _gemm_matmul(lhs, rhs, instr: isa.Matmul, ctx: KernelContext):
    """The matmul as host GEMMs, one per pass (_passes), on operands transposed for them."""
    nm = ctx.nm
    both, lhs_only, rhs_only = _mesh_dims(lhs.shape, rhs.shape, nm)
    rhs_k_major = _contraction_first(rhs.ndim - nm, instr.rhs_batch, instr.rhs_contract)
    lhs3 = _to_batch_free_k(lhs, nm, both, lhs_only, instr.lhs_batch, instr.lhs_contract)
    rhs3 = _to_batch_free_k(rhs, nm, both, rhs_only, instr.rhs_batch, instr.rhs_contract,
                            rhs_k_major)
    out = _passes(lhs3, rhs3, instr, ctx, rhs_k_major=rhs_k_major)

    # out dims: (both mesh, local batch, lhs-only mesh, lhs free, rhs-only mesh, rhs free)
    local_batch = tuple(lhs.shape[nm + d] for d in instr.lhs_batch)
    lhs_free = _free_shape(lhs.shape, nm, instr.lhs_batch, instr.lhs_contract)
    rhs_free = _free_shape(rhs.shape, nm, instr.rhs_batch, instr.rhs_contract)
    mesh_sizes = ctx.mesh.axis_sizes
    out = out.reshape(tuple(mesh_sizes[a] for a in both) + local_batch
                      + tuple(mesh_sizes[a] for a in lhs_only) + lhs_free
                      + tuple(mesh_sizes[a] for a in rhs_only) + rhs_free)
    out = lax.transpose(out, _result_order(nm, both, lhs_only, rhs_only, len(local_batch),
                                           len(lhs_free), len(rhs_free)))
    return out.reshape(ctx.out_shape(instr))


def _result_order(nm: int, both, lhs_only, rhs_only, n_batch: int, n_lhs_free: int,
                  n_rhs_free: int) -> tuple[int, ...]:
    """The transpose from the host GEMM's result dims (both mesh, local batch, lhs-only
    mesh, lhs free, rhs-only mesh, rhs free) to the executor's (mesh dims in mesh order,
    then batch, lhs free, rhs free)."""
    sizes = [len(both), n_batch, len(lhs_only), n_lhs_free, len(rhs_only), n_rhs_free]
    starts = np.cumsum([0] + sizes)
    mesh_pos = {a: int(starts[0]) + i for i, a in enumerate(both)}
    mesh_pos.update({a: int(starts[2]) + i for i, a in enumerate(lhs_only)})
    mesh_pos.update({a: int(starts[4]) + i for i, a in enumerate(rhs_only)})
    local_order = (list(range(starts[1], starts[2])) + list(range(starts[3], starts[4]))
                   + list(range(starts[5], starts[6])))
    return tuple([mesh_pos[a] for a in range(nm) if a in mesh_pos] + local_order)


def result_is_gemm_output(instr: isa.Matmul, program: isa.Program, on_cpu: bool) -> bool:
    """Whether the kernel's result array is the host GEMM's output itself, only reshaped
    (no transposing copy, no broadcast to its layout): XLA then writes the GEMM (or, for
    a narrower output type, its rounding) straight into the result's buffer. The native
    loop writes every result in its layout (`on_cpu`: the executor's devices are CPUs)."""
    if runs_natively(instr, program, on_cpu):
        return True
    nm = program.mesh.rank
    lhs, rhs = (program.array_shape(v) for v in instr.ins)
    both, lhs_only, rhs_only = _mesh_dims(lhs, rhs, nm)
    out = program.values[instr.outs[0]]
    if set(out.varying) != set(both + lhs_only + rhs_only):
        return False
    free = [len(_free_shape(x, nm, batch, contract)) for x, batch, contract in
            ((lhs, instr.lhs_batch, instr.lhs_contract), (rhs, instr.rhs_batch,
                                                          instr.rhs_contract))]
    order = _result_order(nm, both, lhs_only, rhs_only, len(instr.lhs_batch), *free)
    return order == tuple(sorted(order))


def _free_dims(local_rank: int, batch, contract) -> list[int]:
    """An operand's local dims that are neither batch nor contraction dims, in order."""
    return [d for d in range(local_rank) if d not in batch and d not in contract]


def _free_shape(shape, nm, batch, contract) -> tuple[int, ...]:
    return tuple(shape[nm + d] for d in _free_dims(len(shape) - nm, batch, contract))


def _contraction_first(local_rank: int, batch, contract) -> bool:
    """Whether the right operand's contraction dims all come before its free dims in its
    own layout (a weight [K, N]): it then goes to the host GEMM as [B, K, N], the layout a
    host GEMM takes as it is (no transposing copy), and its passes are contiguous blocks of
    rows. (The left operand goes as [B, M, K] whatever its layout: host GEMMs run slower
    on a transposed left operand than the copy costs.)"""
    free = _free_dims(local_rank, batch, contract)
    return bool(free) and bool(contract) and max(contract) < min(free)


def _to_batch_free_k(x, nm, both, only, batch, contract, k_major: bool = False):
    """x as [B, F, K], or [B, K, F] when `k_major`: B = (shared mesh dims, local batch dims),
    F = (own mesh dims, free dims), K = contraction dims flattened in the dot's order."""
    free = _free_dims(x.ndim - nm, batch, contract)
    b_dims = both + [nm + d for d in batch]
    f_dims = only + [nm + d for d in free]
    k_dims = [nm + d for d in contract]
    dropped = [a for a in range(nm) if a not in both and a not in only]  # size-1 mesh dims
    groups = [b_dims, k_dims, f_dims] if k_major else [b_dims, f_dims, k_dims]
    y = lax.transpose(x, tuple(dropped + [d for g in groups for d in g]))
    sizes, start = [], len(dropped)
    for g in groups:
        sizes.append(int(np.prod(y.shape[start:start + len(g)], dtype=np.int64)))
        start += len(g)
    return y.reshape(tuple(sizes))


def _passes(lhs3, rhs3, instr: isa.Matmul, ctx: KernelContext, out_dtype: str | None = None,
            rhs_k_major: bool = False):
    """[B,M,K] x [B,N,K] (or [B,K,N] when `rhs_k_major`) -> [B,M,N], K cut into passes
    accumulated in FP32 in order."""
    out_dtype = out_dtype or instr.out_dtype
    if out_dtype in dtypes.COMPLEX_PARTS:
        return _complex_passes(lhs3, rhs3, instr, ctx, dtypes.COMPLEX_PARTS[out_dtype],
                               rhs_k_major)
    k_axes = [2, 1 if rhs_k_major else 2]
    if not dtypes.is_float(out_dtype):
        acc = dtypes.numpy_dtype(out_dtype)
        return lax.dot_general(lhs3.astype(acc), rhs3.astype(acc),
                               (((k_axes[0],), (k_axes[1],)), ((0,), (0,))),
                               preferred_element_type=acc)
    k = lhs3.shape[k_axes[0]]
    host = _host_dtype(lhs3.dtype, rhs3.dtype, single_pass=k <= instr.pass_size)
    # In their own types, each pass converted to `host` once cut; sub-byte types are
    # converted up front (there is no unsigned integer of their width to bitcast them to)
    operands = [x if dtypes.bit_width(x.dtype.name) >= 8 else x.astype(host)
                for x in (lhs3, rhs3)]
    if ctx.on_cpu and native.runs(host):
        # On CPU executor devices, the native loop: one tile of the result at a time, the
        # same bits on every host; the XLA loop elsewhere
        acc = _native_passes(*operands, host=host, size=instr.pass_size,
                             rhs_k_major=rhs_k_major)
    else:
        acc = _looped_passes(*operands, host=host, size=instr.pass_size, k_axes=k_axes)
    return numerics.round_to(acc, out_dtype, ctx.rounding)


def _native_passes(lhs3, rhs3, host, size: int, rhs_k_major: bool):
    """_looped_passes' result, from the native loop (mesh.isa.kernels.native)."""
    k_dim, n_dim = (1, 2) if rhs_k_major else (2, 1)
    out = lhs3.shape[:2] + rhs3.shape[n_dim:n_dim + 1]
    return native.pass_matmul(
        lhs3.astype(host), rhs3.astype(host), size,
        [native.offsets(lhs3.shape, [d]) for d in (0, 1)],
        [native.offsets(rhs3.shape, [d]) for d in (0, k_dim, n_dim)],
        [native.offsets(out, [d]) for d in (0, 1, 2)], out)[0]


def _looped_passes(lhs3, rhs3, host, size: int, k_axes: list[int]):
    """[B,M,K] x [B,N,K] or [B,K,N] (contraction axes `k_axes`) -> [B,M,N]: each pass of
    `size` one host GEMM of `host` operands accumulating in FP32 (FP64 for FP64), added in
    order by XLA."""
    batch, k = lhs3.shape[0], lhs3.shape[k_axes[0]]
    operands = [lhs3, rhs3]
    if batch == 1:  # a plain GEMM is faster on the host than a batch of one
        operands, k_axes = [x[0] for x in operands], [a - 1 for a in k_axes]
    batch_dims = ((), ()) if batch == 1 else ((0,), (0,))
    accumulate = jnp.float64 if host == jnp.float64 else jnp.float32  # PSUM: FP32

    def product(lhs, rhs):  # one pass: a host GEMM accumulating in `accumulate`
        return lax.dot_general(lhs.astype(host), rhs.astype(host),
                               (((k_axes[0],), (k_axes[1],)), batch_dims),
                               precision=lax.Precision.HIGHEST,
                               preferred_element_type=accumulate)

    def pass_of(x, axis, start, length):
        return lax.dynamic_slice_in_dim(x, start, length, axis=axis)

    whole, rest = divmod(k, size)
    acc = product(*(pass_of(x, a, 0, min(size, k)) for x, a in zip(operands, k_axes)))
    if whole > 1:
        # The later whole passes, added one after another by a loop (one host GEMM in the
        # program). The first pass is peeled off, as the loop's initial accumulator: a
        # loop over every pass from an accumulator of -0.0 (which adds exactly) compiles
        # two kernels fewer, but its extra pass over the accumulator cost tp_mlp_bf16 about
        # 5% of a step. Each pass is cut out of an operand and converted in one kernel.
        # The operands go through the loop as raw bits: XLA:CPU would otherwise widen
        # narrow ones to FP32 before the loop (a copy at twice the size), and fold the
        # transposing copy of a left operand into the loop's GEMM, which then sums its
        # pass in another order than the peeled first pass.
        looped = [_to_bits(x) for x in operands]

        def add_pass(p, acc):
            return acc + product(*(_from_bits(pass_of(b, a, p * size, size), x.dtype)
                                   for b, x, a in zip(looped, operands, k_axes)))

        acc = lax.fori_loop(1, whole, add_pass, acc)
    if rest and whole:
        acc = acc + product(*(pass_of(x, a, whole * size, rest)
                              for x, a in zip(operands, k_axes)))
    return acc[None] if batch == 1 else acc


def _complex_passes(lhs3, rhs3, instr: isa.Matmul, ctx: KernelContext, part: str,
                    rhs_k_major: bool):
    """A complex product as 4 real ones on the Tensor Engine (the "4M" method, as BLAS's
    CGEMM): Re = Ar Br - Ai Bi, Im = Ar Bi + Ai Br, each real product accumulated in passes
    like any real matmul and the two combined on the Vector Engine. Gauss's 3-product
    method saves a product but its Im = (Ar + Ai)(Br + Bi) - Ar Br - Ai Bi cancels large
    terms, so its imaginary parts lose accuracy when Ar Br and Ai Bi are large."""
    def product(a, b):
        return _passes(a, b, instr, ctx, part, rhs_k_major)

    ar, ai, br, bi = lax.real(lhs3), lax.imag(lhs3), lax.real(rhs3), lax.imag(rhs3)
    return lax.complex(product(ar, br) - product(ai, bi), product(ar, bi) + product(ai, br))


def _to_bits(x):
    """x's bits as unsigned integers of its width (bitcast, no conversion)."""
    return lax.bitcast_convert_type(x, jnp.dtype(f"uint{jnp.dtype(x.dtype).itemsize * 8}"))


def _from_bits(bits, dtype):
    return lax.bitcast_convert_type(bits, dtype)


_BF16_EXACT = dtypes.FP8_TYPES | {"bfloat16"}


def _host_dtype(lhs_dtype, rhs_dtype, single_pass: bool = False):
    """BF16 when both operands are exactly BF16 values (BF16 or FP8); FP64 for FP64 inputs
    (not a Trainium2 type: computed as the program says); FP32 otherwise.

    FP8 operands of a single pass go as FP32 (as exact): XLA:CPU in jaxlib 0.10 may give
    that GEMM of converted FP8 operands, where it folds a transpose into it, to its Eigen
    dot, which has no BF16 (UNIMPLEMENTED when it runs); a pass loop cuts its operands
    out, so the loop's GEMMs take them as they are."""
    names = {np.dtype(lhs_dtype).name, np.dtype(rhs_dtype).name}
    if names <= _BF16_EXACT and not (single_pass and names & dtypes.FP8_TYPES):
        return jnp.bfloat16
    return jnp.float64 if "float64" in names else jnp.float32
