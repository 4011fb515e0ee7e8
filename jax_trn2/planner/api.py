"""The names of ``jax_trn2.plan``: the sweeps and grids of jax_trn2.planner.plan and the
search of large spaces of jax_trn2.planner.search, which builds on the sweep (so the two
modules stay one-way: search imports plan)."""

from jax_trn2.planner import plan as _plan
from jax_trn2.planner.plan import *  # noqa: F401,F403
from jax_trn2.planner.plan import __all__ as _plan_names
from jax_trn2.planner.search import Pruned, Search, search

__doc__ = _plan.__doc__
__all__ = [*_plan_names, "search", "Search", "Pruned"]
