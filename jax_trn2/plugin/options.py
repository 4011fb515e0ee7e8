"""The simulated machine's options: for the client (the topology and its faults, the
default rounding), and per program (rounding, seed, memory check, a topology with faults).

Client options come from `jax.config.update("jax_pjrt_client_create_options",
"topology:trn2;failed_chips:5")` (or a dict), which jax passes to PJRT_Client_Create, or
else from the environment:

    JAX_TRN2_TOPOLOGY      a preset: trn2 (16 chips), trn2-ultra (64, the default),
                           trn2-ultra-max (256) or trn2-ultracluster-N (64 N)
    JAX_TRN2_FAILED_LINKS  failed cables, "a-b,c-d" (chip ids of neighbours, both ways)
    JAX_TRN2_FAILED_CHIPS  failed chips, "5,6"
    JAX_TRN2_ROUNDING      "nearest" (default) or "stochastic"
    JAX_TRN2_SEED          the stochastic rounding seed (default 0)

Program options are jax.jit's `compiler_options` with a `trn2_` prefix (jax passes them
to PJRT_Client_Compile): `trn2_rounding`, `trn2_seed`, `trn2_check_memory`,
`trn2_topology` (a preset name, or the key of a Topology jax_trn2.jit registered with
`topology_key`: a Topology object with its own faults or numbers, of as many chips as the
client has).
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from mesh.machine import Topology, get_topology

DEFAULT_TOPOLOGY = "trn2-ultra"
PREFIX = "trn2_"
_ENV = {"topology": "JAX_TRN2_TOPOLOGY", "failed_links": "JAX_TRN2_FAILED_LINKS",
        "failed_chips": "JAX_TRN2_FAILED_CHIPS", "rounding": "JAX_TRN2_ROUNDING",
        "seed": "JAX_TRN2_SEED"}
_PROGRAM_KEYS = ("rounding", "seed", "check_memory", "topology")

# Topology objects jax_trn2.jit passes by key (compiler options carry only scalars).
_TOPOLOGIES: dict[str, Topology] = {}
_TOPOLOGY_KEYS: dict[Topology, str] = {}
_topology_lock = threading.Lock()
_counter = itertools.count()


def topology_key(topology: Topology) -> str:
    """A `trn2_topology` compiler option naming `topology` (its preset name if it is one)."""
    try:
        if get_topology(topology.name) == topology:
            return topology.name
    except ValueError:  # a name of the user's own
        pass
    with _topology_lock:
        key = _TOPOLOGY_KEYS.get(topology)
        if key is None:
            key = f"{topology.name}#{next(_counter)}"
            _TOPOLOGY_KEYS[topology] = key
            _TOPOLOGIES[key] = topology
        return key


def topology_named(name: str) -> Topology:
    """The topology of a `trn2_topology` option or a client option: a registered key or a
    preset name."""
    return _TOPOLOGIES.get(name) or get_topology(name)


@dataclass(frozen=True)
class ClientOptions:
    topology: Topology
    rounding: str = "nearest"
    seed: int = 0


def client_options(given: Mapping[str, Any]) -> ClientOptions:
    """The client's options from PJRT_Client_Create's named values, else the environment;
    ValueError naming an option it does not know or a value it cannot read."""
    known = set(_ENV)
    unknown = sorted(set(given) - known)
    if unknown:
        raise ValueError(f"unknown trn2 client option(s) {unknown}; known: {sorted(known)} "
                         "(jax_pjrt_client_create_options, 'key:value;key:value')")
    value = {k: given[k] if k in given else os.environ.get(env) for k, env in _ENV.items()}
    topology = topology_named(str(value["topology"] or DEFAULT_TOPOLOGY))
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
    return ClientOptions(topology, rounding_name(value["rounding"] or "nearest"),
                         _int(value["seed"] or 0, "seed"))


@dataclass(frozen=True)
class ProgramOptions:
    rounding: str
    seed: int
    check_memory: bool
    topology: Topology


def program_options(overrides: list[tuple[str, Any]], client: ClientOptions) -> ProgramOptions:
    """A program's options from the compile options' env_option_overrides (jax.jit's
    compiler_options): `trn2_*`, defaulting to the client's. Any other option is XLA's,
    which does not compile the program here: ValueError naming it."""
    given = {}
    for key, value in overrides:
        if not key.startswith(PREFIX) or key[len(PREFIX):] not in _PROGRAM_KEYS:
            raise ValueError(
                f"compiler option {key!r} is not one the trn2 simulator knows (XLA's options "
                "do not apply: the program is lowered to Trainium2 instructions, not compiled "
                f"by XLA); known: {[PREFIX + k for k in _PROGRAM_KEYS]}")
        given[key[len(PREFIX):]] = value
    topology = topology_named(str(given["topology"])) if "topology" in given \
        else client.topology
    return ProgramOptions(rounding_name(given.get("rounding", client.rounding)),
                          _int(given.get("seed", client.seed), "seed"),
                          _bool(given.get("check_memory", True)), topology)


def rounding_name(value: Any) -> str:
    if value not in ("nearest", "stochastic"):
        raise ValueError(f"rounding must be 'nearest' or 'stochastic', got {value!r}")
    return value


def _items(text: Any) -> list[str]:
    return [item.strip() for item in str(text).split(",") if item.strip()]


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: expected an integer, got {value!r}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"trn2_check_memory: expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    return bool(value)
