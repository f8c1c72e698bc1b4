"""The simulated device: true power in segments, and what its meters report of it.

The engine sets the device's dynamic power at each step's start, with when the step's work
ends; the device adds its static power, which warms with load when ``thermal_leak_w`` is set (a
thermal state ``h`` in [0, 1] relaxing toward the dynamic power's share of the headroom), and
is ``clocks_up_w`` higher while the clocks are up: from the device's start (a server loads its
weights and captures its graphs at full clocks) and while it works, until it has been idle for
``clock_down_s``. The delay is 10 s by default so that a run's baseline reads the raised static,
as the H100 runs' baseline windows did (~124 W against 72.7 W idle): the harness measures it
from about 1 s after starting the server, for 1 s (``--baseline-s``), and a slow host or a
longer baseline stays inside 10 s. The run then anchors static where it stays while the run
serves; a baseline read at idle static would put the clocks' ~51 W into every request's dynamic
energy. A device idle past the delay drops its clocks, and static falls to idle. Between
settings the true power is constant, so everything else is analytic per segment: the true
energy (the truth), the static energy (what the truth shares equally), the heat, and the
metered power, a first-order lag of the true power with time constant ``meter_lag_ms`` whose
integral feeds the counter. The counter holds whole mJ and updates on a grid from ``t0`` every ``counter_period_ms``, each update moved
by a fixed pseudo-random jitter within ``counter_jitter_ms``. A faulty counter
(``counter_fault``) holds its first value (stuck), or shows an older update's value every tenth
update (backwards), as counters read by several threads have been seen to.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import deque
from typing import TYPE_CHECKING, NamedTuple

from .._clock import NS, now_ns

if TYPE_CHECKING:
    from .physics import EngineConfig

AMBIENT_C = 30.0
HOT_RISE_C = 50.0  # above ambient at h = 1


class _Segment(NamedTuple):
    """A stretch of constant true power, with every accumulator's value at its start."""

    start: int
    energy: float  # true, J
    static_energy: float  # J
    metered: float  # the meter's energy, J
    metered_w: float  # the meter's power at the start
    heat: float  # thermal state h
    power: float  # true power over the segment, W
    static_w: float
    heat_target: float


class Device:
    """Energy and power over time, with GPU-like readouts that may lag and jitter."""

    HISTORY_NS = 3 * NS

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.t0 = now_ns()
        self._lag_s = config.meter_lag_ms / 1000
        self._thermal_s = config.thermal_tau_s
        period_ms = config.counter_period_ms
        self._period = int(period_ms * 1e6)
        # below half a period, so that the k-th update always comes before the (k+1)-th
        self._jitter_ns = min(config.counter_jitter_ms, 0.49 * period_ms) * 1e6
        self._clock_down_ns = round(config.clock_down_s * NS)
        self._worked_ns = self.t0  # when the device last worked: its start counts
        self._working = False  # the latest segment works until the next setting
        self._clocks_up = config.clocks_up_w > 0  # the latest segment's static has them up
        static = config.static_w + config.clocks_up_w
        first = _Segment(self.t0, 0.0, 0.0, 0.0, static, 0.0, static, static, 0.0)
        self._starts: deque[int] = deque([self.t0])
        self._segments: deque[_Segment] = deque([first])
        self._stuck_mj: int | None = None  # a stuck counter's value: its first read's

    def _at(self, t_ns: int) -> tuple[_Segment, float]:
        """The segment holding ``t_ns`` and the seconds into it."""
        i = max(0, bisect.bisect_right(self._starts, t_ns) - 1)
        seg = self._segments[i]
        return seg, max(0, t_ns - seg.start) / NS

    def set_power(self, t_ns: int, dynamic_w: float, until_ns: int | None = None) -> float:
        """From ``t_ns`` on the device draws its static power plus ``dynamic_w``, until
        ``until_ns`` when given (the step's work done: static alone from then); returns that
        static power (held until the next setting). It works while it draws dynamic power or
        until ``until_ns``."""
        # A step's loop may wake a hair before the previous step's work ends (a loop timer
        # fires up to a millisecond early): it starts when that work ends. A segment out of
        # time order would make the lookup by time find the wrong one and rewrite the past.
        t_ns = max(t_ns, self._starts[-1])
        if until_ns is not None:
            until_ns = max(until_ns, t_ns)
        if self._working:
            self._worked_ns = t_ns
        working = dynamic_w > 0 or until_ns is not None
        static_w = self._append(t_ns, dynamic_w, working)
        self._working = working and until_ns is None
        if until_ns is not None:
            self._worked_ns = until_ns
            self._append(until_ns, 0.0, working=False)
        return static_w

    def _append(self, t_ns: int, dynamic_w: float, working: bool) -> float:
        cfg = self.config
        static_w = self.static_at(t_ns, working)
        self._clocks_up = cfg.clocks_up_w > 0 and self._clocks_up_at(t_ns, working)
        headroom = cfg.max_w - cfg.static_w
        target = min(1.0, max(0.0, dynamic_w / headroom)) if headroom > 0 else 0.0
        seg = _Segment(
            t_ns,
            self.energy_at(t_ns),
            self.static_energy_at(t_ns),
            self.metered_energy_at(t_ns),
            self.metered_power_at(t_ns),
            self.heat_at(t_ns),
            static_w + dynamic_w,
            static_w,
            target,
        )
        self._starts.append(t_ns)
        self._segments.append(seg)
        while len(self._starts) > 2 and self._starts[1] < t_ns - self.HISTORY_NS:
            self._starts.popleft()
            self._segments.popleft()
        return static_w

    def clocks_drop_ns(self) -> int | None:
        """When the clocks drop if the device stays idle; None while it works, or when they are
        down already (the engine sets the device again then, so its static power falls)."""
        if self._working or not self._clocks_up:
            return None
        return self._worked_ns + self._clock_down_ns

    def energy_at(self, t_ns: int) -> float:
        seg, dt = self._at(t_ns)
        return seg.energy + seg.power * dt

    def static_energy_at(self, t_ns: int) -> float:
        seg, dt = self._at(t_ns)
        return seg.static_energy + seg.static_w * dt

    def power_at(self, t_ns: int) -> float:
        return self._at(t_ns)[0].power

    def heat_at(self, t_ns: int) -> float:
        seg, dt = self._at(t_ns)
        return seg.heat_target + (seg.heat - seg.heat_target) * math.exp(-dt / self._thermal_s)

    def static_at(self, t_ns: int, working: bool = False) -> float:
        """Static power set at ``t_ns``: idle static, plus ``clocks_up_w`` while working or
        within ``clock_down_s`` of the last work, plus the leakage of a warm die."""
        cfg = self.config
        clocks_up = cfg.clocks_up_w if self._clocks_up_at(t_ns, working) else 0.0
        return cfg.static_w + clocks_up + cfg.thermal_leak_w * self.heat_at(t_ns)

    def _clocks_up_at(self, t_ns: int, working: bool) -> bool:
        return working or t_ns - self._worked_ns < self._clock_down_ns

    def metered_energy_at(self, t_ns: int) -> float:
        """The integral of the power the meter sees (the true energy when it does not lag)."""
        seg, dt = self._at(t_ns)
        flat = seg.metered + seg.power * dt
        if self._lag_s <= 0:
            return flat
        return flat + (seg.metered_w - seg.power) * self._lag_s * -math.expm1(-dt / self._lag_s)

    def metered_power_at(self, t_ns: int) -> float:
        seg, dt = self._at(t_ns)
        if self._lag_s <= 0:
            return seg.power
        return seg.power + (seg.metered_w - seg.power) * math.exp(-dt / self._lag_s)

    def update_time(self, k: int) -> int:
        """When the counter's k-th update lands."""
        if k <= 0 or self._jitter_ns <= 0:
            return self.t0 + k * self._period
        digest = hashlib.blake2b(k.to_bytes(8, "little"), digest_size=8).digest()
        u = int.from_bytes(digest, "little") / 2**64  # uniform in [0, 1), fixed per k
        return self.t0 + k * self._period + round((2 * u - 1) * self._jitter_ns)

    def last_update(self, t_ns: int) -> int:
        """The latest counter update at or before ``t_ns``."""
        if self._period <= 0:
            return t_ns
        k = max(0, (t_ns - self.t0) // self._period)
        # jitter under half a period: the answer is update k-1, k or k+1
        for candidate in (k + 1, k):
            if self.update_time(candidate) <= t_ns:
                return self.update_time(candidate)
        return self.update_time(max(0, k - 1))

    def _counter_time(self, t_ns: int) -> int:
        """Up to when the counter read at ``t_ns`` has counted, faults included."""
        update = self.last_update(t_ns)
        if self.config.counter_fault == "backwards" and self._period > 0:
            k = round((update - self.t0) / self._period)  # the jitter is under half a period
            if k % 10 == 9:
                return self.update_time(k - 3)
        return update

    def readout(self) -> dict[str, float | int | None]:
        """What the device reports now, as NVML would."""
        t = now_ns()
        every = self.config.dropout_every_s
        if every and ((t - self.t0) // NS) % every == every - 1:
            return {"t_ns": t, "energy_mj": None, "power_w": None, "avg_power_w": None, "temperature_c": None}
        window = min(NS, t - self.t0)
        avg = None
        if window > 0:
            avg = (self.metered_energy_at(t) - self.metered_energy_at(t - window)) / (window / NS)
        mode = self.config.telemetry
        energy_mj = math.floor(self.metered_energy_at(self._counter_time(t)) * 1000)
        if self.config.counter_fault == "stuck":
            self._stuck_mj = energy_mj if self._stuck_mj is None else self._stuck_mj
            energy_mj = self._stuck_mj
        return {
            "t_ns": t,
            "energy_mj": energy_mj if mode == "counter" else None,
            "power_w": self.metered_power_at(t) if mode in ("counter", "power") else None,
            "avg_power_w": avg if mode in ("counter", "avg-power") else None,
            "temperature_c": AMBIENT_C + HOT_RISE_C * self.heat_at(t),
        }
