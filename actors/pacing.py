"""A token bucket for `--max-episode-rate`: the benchmark control that runs async collection at sync's
episode rate, so a comparison of the two measures asynchrony and not the amount of data."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

EPSILON = 1e-9
"""A token this close to whole counts as whole: clock readings are sums of floats."""


class TokenBucket:
    """At most `rate` takes per second over time, and at most `burst` at once: a token accrues every
    1/rate seconds up to `burst` tokens, and each `take` spends one. It starts full."""

    def __init__(self, rate: float, burst: float = 1.0, clock: Callable[[], float] = time.monotonic):
        if not (rate > 0 and math.isfinite(rate)):
            raise ValueError(f"a token bucket's rate must be positive and finite, got {rate}")
        if not (burst >= 1 and math.isfinite(burst)):
            raise ValueError(f"a token bucket's burst must be at least 1, got {burst}")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = burst
        self._last = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self._last) * self.rate)
        self._last = now

    def take(self) -> bool:
        """Spend a token if there is one (True), else leave the bucket as it is (False)."""
        self._refill()
        if self.tokens >= 1 - EPSILON:
            self.tokens -= 1
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until the next `take` can succeed (0 when one can now)."""
        self._refill()
        return max(0.0, (1 - EPSILON - self.tokens) / self.rate)
