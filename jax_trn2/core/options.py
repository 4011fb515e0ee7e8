"""The simulated machine's options: for the client (the topology and its faults, the
default rounding), and per program (rounding, seed, memory check, topology), the same for
plain jax.jit on the plugin's devices and for jax_trn2.jit.

Client options come from `jax.config.update("jax_pjrt_client_create_options",
"topology:trn2;failed_chips:5")` (or a dict), which jax passes to PJRT_Client_Create, or
else from the environment:

    JAX_TRN2_TOPOLOGY      a preset with a device per chip: trn2 (16 chips), trn2-ultra
                           (64, the default), trn2-ultra-max (256) or trn2-ultracluster-N
                           (64 N); or a machine as AWS rents it, a device per logical
                           NeuronCore (4 per chip at LNC=2): trn2.3xlarge (1 chip),
                           trn2.48xlarge or trn2u.48xlarge (16 chips: 64 devices),
                           trn2-ultraserver (64 chips) or trn2-ultraserver-cluster-N
    JAX_TRN2_LNC           the logical-core setting of those machines: 2 (default) or 1
                           (8 devices per chip)
    JAX_TRN2_FAILED_LINKS  failed cables, "a-b,c-d" (chip ids of neighbours, both ways)
    JAX_TRN2_FAILED_CHIPS  failed chips, "5,6"
    JAX_TRN2_ROUNDING      "nearest" (default) or "stochastic"
    JAX_TRN2_SEED          the stochastic rounding seed (default 0)

Under jax.distributed, jax adds `node_id` and `num_nodes` (this process's index and the
process count; `partition_index` too, on some jobs): the simulated machine's devices are
then split over the processes in blocks of consecutive ids, as a multi-host Trn2 job's
NeuronCores are, each process addressing its own block.

Program options are `compiler_options` with a `trn2_` prefix, of jax.jit (jax passes them
to PJRT_Client_Compile) and of jax_trn2.jit alike: `trn2_rounding`, `trn2_seed`,
`trn2_check_memory`, `trn2_topology` (a preset name; jax_trn2.jit also takes a Topology
object, with its own faults or numbers: jax.jit's options carry only scalars), `trn2_lnc`
(the logical-core setting of that machine).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from jax_trn2.core.platform import DEFAULT_TOPOLOGY
from mesh.machine import Topology, get_topology
from mesh.numerics import NEAREST, Rounding

PREFIX = "trn2_"
_ENV = {"topology": "JAX_TRN2_TOPOLOGY", "lnc": "JAX_TRN2_LNC",
        "failed_links": "JAX_TRN2_FAILED_LINKS",
        "failed_chips": "JAX_TRN2_FAILED_CHIPS", "rounding": "JAX_TRN2_ROUNDING",
        "seed": "JAX_TRN2_SEED"}
# What jax passes to every plugin's client under jax.distributed (xla_bridge)
_DISTRIBUTED = ("node_id", "num_nodes", "partition_index")
_PROGRAM_KEYS = ("rounding", "seed", "check_memory", "topology", "lnc")


@dataclass(frozen=True)
class ClientOptions:
    """The plugin client's machine, the rounding of programs that name none, and which
    process of how many (jax.distributed) this client is."""

    topology: Topology
    rounding: Rounding = NEAREST
    process_index: int = 0
    process_count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.process_index < self.process_count:
            raise ValueError(f"node_id {self.process_index} is not one of the job's "
                             f"{self.process_count} processes (num_nodes)")
        if self.process_count > self.topology.num_devices:
            raise ValueError(f"{self.process_count} processes (num_nodes) for the "
                             f"{self.topology.num_devices} devices of {self.topology.name}: "
                             "each process needs at least one")

    def process_of(self, device_id: int) -> int:
        """The process that owns device `device_id`: blocks of consecutive ids, as even as
        the count allows."""
        return device_id * self.process_count // self.topology.num_devices


def client_options(given: Mapping[str, Any]) -> ClientOptions:
    """The client's options from PJRT_Client_Create's named values, else the environment;
    ValueError naming an option it does not know or a value it cannot read."""
    known = set(_ENV) | set(_DISTRIBUTED)
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"unknown trn2 client option(s) {unknown}; known: {sorted(known)} "
                         "(jax_pjrt_client_create_options, 'key:value;key:value')")
    value = {k: given[k] if k in given else os.environ.get(env) for k, env in _ENV.items()}
    topology = machine(str(value["topology"] or DEFAULT_TOPOLOGY), value["lnc"])
    overrides = {}
    if value["failed_links"]:
        links = set()
        for pair in _items(value["failed_links"]):
            a, sep, b = pair.partition("-")
            if not sep:
                raise ValueError(f"failed_links: {pair!r} is not 'a-b' (two chip ids)")
            a, b = _int(a, "failed_links"), _int(b, "failed_links")
            links |= {(a, b), (b, a)}
        overrides["failed_links"] = frozenset(links)
    if value["failed_chips"]:
        overrides["failed_chips"] = frozenset(_int(c, "failed_chips")
                                              for c in _items(value["failed_chips"]))
    if overrides:
        topology = topology.with_overrides(**overrides)
    return ClientOptions(topology, Rounding(value["rounding"] or NEAREST.mode,
                                            _int(value["seed"] or 0, "seed")),
                         _int(given.get("node_id", 0), "node_id"),
                         _int(given.get("num_nodes", 1), "num_nodes"))


@dataclass(frozen=True)
class ProgramOptions:
    """How one program is compiled: its rounding, whether compiling checks that it fits
    each chip's HBM, and its machine (None: jax_trn2.jit's default, the machine its mesh
    was made for)."""

    rounding: Rounding = NEAREST
    check_memory: bool = True
    topology: Topology | None = None


def program_options(given: Mapping[str, Any] | Iterable[tuple[str, Any]],
                    defaults: ProgramOptions = ProgramOptions()) -> ProgramOptions:
    """A program's options from compiler options (`trn2_*`, a mapping or the compile
    options' env_option_overrides), each not given as in `defaults`. Any other option must
    be one of XLA's, as on every backend (XLA's own parser checks it: "No such compile
    option" otherwise), and changes nothing: XLA does not compile the program here."""
    if isinstance(given, (str, bytes)):
        raise TypeError(f"compiler_options: expected a mapping of option names to values, "
                        f"got {given!r}")
    options, xla_options = {}, []
    for key, value in (given.items() if isinstance(given, Mapping) else given):
        if isinstance(key, str) and key.startswith(PREFIX):
            if key[len(PREFIX):] not in _PROGRAM_KEYS:
                raise ValueError(f"No such compile option: {key!r}; the trn2 simulator's are "
                                 f"{[PREFIX + k for k in _PROGRAM_KEYS]}")
            options[key[len(PREFIX):]] = value
        else:
            xla_options.append((key, value))
    check_xla_options(xla_options)
    topology = options.get("topology", defaults.topology)
    if topology is not None and not isinstance(topology, Topology):
        topology = machine(str(topology), options.get("lnc"))
    elif options.get("lnc") is not None:
        if topology is None:
            raise ValueError("trn2_lnc sets the logical-core setting of the machine "
                             "trn2_topology names: give that too (e.g. trn2_topology="
                             "'trn2.48xlarge', trn2_lnc=1)")
        topology = topology.with_overrides(lnc=_int(options["lnc"], "trn2_lnc"))
    rounding = Rounding(options.get("rounding", defaults.rounding.mode),
                        _int(options.get("seed", defaults.rounding.seed), "trn2_seed"))
    return ProgramOptions(rounding, _bool(options.get("check_memory", defaults.check_memory)),
                          topology)


def check_xla_options(given: Sequence[tuple[Any, Any]]) -> None:
    """ValueError with XLA's own message unless XLA takes each option and value (its
    DebugOptions fields), checked by compiling an empty program with them on a host CPU
    client, once per set of options."""
    key = tuple(sorted((str(name), repr(value)) for name, value in given))
    if not key or key in _XLA_OPTIONS_TAKEN:
        return
    from jax._src.lib import xla_client
    from lowering.host import host_client
    client = host_client(1)
    options = xla_client.CompileOptions()
    options.env_option_overrides = list(given)
    try:
        client.compile_and_load(_EMPTY_PROGRAM, xla_client.DeviceList(tuple(client.devices())),
                                options)
    except Exception as e:  # jaxlib's own error type
        raise ValueError(f"compiler options: {str(e).removeprefix('INVALID_ARGUMENT: ')}") \
            from None
    _XLA_OPTIONS_TAKEN.add(key)


_XLA_OPTIONS_TAKEN: set[tuple] = set()
_EMPTY_PROGRAM = b"module { func.func @main() { return } }"


def machine(name: str, lnc: Any = None) -> Topology:
    """The preset `name` at logical-core setting `lnc` (None: its own, LNC=2 for the
    machines as rented); ValueError for an LNC a whole-chip preset cannot take."""
    if lnc is None or lnc == "":
        return get_topology(name)
    return get_topology(name, lnc=_int(lnc, "lnc"))


def _items(text: Any) -> list[str]:
    return [item.strip() for item in str(text).split(",") if item.strip()]


def _int(value: Any, name: str) -> Any:
    """An integer spelled as text (an environment variable's, a client option's) as an int;
    any other value as it is, for the option's own check (a float is no seed)."""
    if not isinstance(value, str):
        return value
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None


def _bool(value: Any) -> bool:
    """A bool, or one spelled as text ("true"/"false"/"1"/"0"): ValueError for anything
    else (None or 0.0 must not quietly turn the memory check off)."""
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
        return value.lower() in ("true", "1")
    if isinstance(value, (bool, np.bool_)) or (isinstance(value, int) and value in (0, 1)):
        return bool(value)
    raise ValueError(f"trn2_check_memory: expected true or false, got {value!r}")
