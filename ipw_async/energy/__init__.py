"""Per-query energy from a run's telemetry: every joule goes to a query or to idle.

The stages, each a module: :mod:`.counter` (a meter as a virtual counter), :mod:`.steps`
(engine steps inferred from token arrivals, with each request's work), :mod:`.placement`
(where their prompts ran) and :mod:`.padding` (the buckets a padded decode graph ran, and the
capture sizes and batch layout chosen from the step times),
:mod:`.work` (that work as weights for the split), :mod:`.problem`
(a meter's intervals and the steps, as a fit needs them), :mod:`.model`, :mod:`.parameters` and
:mod:`.fit` (the device's power model, its parameters as a table, fitted as richly as the run
supports) with :mod:`.prefill` (whether the run tells a prompt token's weight), :mod:`.drift`
and :mod:`.lag` (static power that drifts, a meter that lags),
:mod:`.stepcost` (the step costs of accounting convention v2, fitted), :mod:`.pooling` (the
stretches an instant power field's energy is kept over), :mod:`.split` (the
conservation-keeping split), :mod:`.band` (the least and most each query could have used) and
:mod:`.attribution` (per meter, the rule, the columns and the summary), with
:mod:`.settings` (what a user asks of them: the rule, the effects, the context sharing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

# loaded on first use: the simulator and the sampler need a stage or two (padding, the counter),
# not the fit and scipy.stats behind attribute (a second of imports on a 2-core host)
_EXPORTS: dict[str, str] = {
    "RULES": "attribution",
    "AttributionConfig": "settings",
    "MeterResult": "attribution",
    "attribute": "attribution",
    "request_windows": "attribution",
    "split_with_known": "attribution",
    "counter_knots": "counter",
    "energy_over": "counter",
    "virtual_counter": "counter",
}

__all__ = [
    "RULES",
    "AttributionConfig",
    "MeterResult",
    "attribute",
    "counter_knots",
    "energy_over",
    "request_windows",
    "split_with_known",
    "virtual_counter",
]

if TYPE_CHECKING:
    from .attribution import RULES, MeterResult, attribute, request_windows, split_with_known
    from .counter import counter_knots, energy_over, virtual_counter
    from .settings import AttributionConfig

__getattr__, __dir__ = lazy_names(__name__, _EXPORTS, globals())
