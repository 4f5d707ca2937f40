"""Distributed prioritized experience replay (DPER) over whole trajectories.

Prioritized replay after Schaul et al. 2016 ("Prioritized Experience Replay", proportional variant):
item i is drawn with P(i) = p_i^alpha / sum_k p_k^alpha and its update is scaled by the importance
weight w_i = (N P(i))^-beta / max_j w_j, beta annealed to 1. As in Ape-X (Horgan et al. 2018,
"Distributed Prioritized Experience Replay") many actors feed one learner-side buffer, new items enter
at the running max priority and the learner refreshes priorities after each update. The unit is a whole
trajectory with the DistRL (2024) priority p = w1 mean|delta| + w2 mean(min(rho_clip, rho)) + w3 mean(H),
H the exact entropy of the current policy (learner/losses/aride.py says why each term is taken as it is).
"""

from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from common.protocol import Episode

T = TypeVar("T")


class SumTree:
    """Fixed-capacity binary sum tree in one float64 array: the root is node 1, node k holds the sum of its
    children, nodes 2k and 2k + 1, and leaf i is node size + i (size: capacity rounded up to a power of
    two; the padding leaves stay 0). Node 0 is unused.

    Floats: each internal node is recomputed as the float64 sum of its two children (never by adding
    deltas), so nothing drifts over many updates and `total` is the exact sum to within the O(log N) ulps
    of a pairwise sum. `find` never returns a zero leaf while total > 0: negative values count as 0, and a
    value at or past the total (rounding, or the caller) lands on the last positive leaf.
    """

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError(f"SumTree capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._depth = (capacity - 1).bit_length()
        self._size = 1 << self._depth  # leaves padded to a power of two with zeros
        self._tree = np.zeros(2 * self._size, np.float64)

    @property
    def total(self) -> float:
        return float(self._tree[1])

    @property
    def leaves(self) -> np.ndarray:
        """The stored priorities, [capacity] (a read-only view)."""
        return _readonly(self._tree[self._size : self._size + self.capacity])

    def set(self, indices: int | np.ndarray, priorities: float | np.ndarray) -> None:
        """Set leaves (vectorized; the last value wins for a repeated index); O(k log N)."""
        idx = np.atleast_1d(np.asarray(indices, np.int64))
        p = np.broadcast_to(np.asarray(priorities, np.float64), idx.shape)
        if idx.size == 0:
            return
        if idx.min() < 0 or idx.max() >= self.capacity:
            raise IndexError(f"SumTree index outside [0, {self.capacity})")
        if not np.all(np.isfinite(p) & (p >= 0)):
            raise ValueError("SumTree priorities must be finite and >= 0")
        if idx.size == 1:  # the common single add: a plain loop beats numpy calls on 1-element arrays
            node, tree = int(idx[0]) + self._size, self._tree
            tree[node] = p[0]
            while node > 1:
                node >>= 1
                tree[node] = tree[2 * node] + tree[2 * node + 1]
            return
        idx, p = _last_per_index(idx, p)
        node = idx + self._size
        self._tree[node] = p
        for _ in range(self._depth):  # a parent listed twice is just written twice with the same sum
            node >>= 1
            self._tree[node] = self._tree[2 * node] + self._tree[2 * node + 1]

    def find_batch(self, values: np.ndarray) -> np.ndarray:
        """For each value the leaf i with prefix(i) <= value < prefix(i + 1), prefix(i) = sum of leaves < i."""
        v = np.maximum(np.array(values, np.float64, ndmin=1), 0.0)
        if np.isnan(v).any():
            raise ValueError("SumTree.find got NaN")
        node, tree = np.ones(v.shape, np.int64), self._tree
        for _ in range(self._depth):
            node <<= 1  # the left child
            left_sum = tree[node]
            right = (v >= left_sum) & (tree[node + 1] > 0)
            v -= left_sum * right
            node += right
        return node - self._size

    def find(self, value: float) -> int:
        return int(self.find_batch(np.array([value]))[0])


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


def _last_per_index(idx: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique indices (sorted) with the last value given for each."""
    idx, last = np.unique(idx[::-1], return_index=True)
    return idx, values[::-1][last]


def trajectory_priority(delta_mean, rho_mean, entropy_mean, weights=(1.0, 1.0, 1.0), eps=1e-6) -> np.ndarray:
    """DistRL priority w1 mean|delta| + w2 mean(rho) + w3 mean(H) + eps, per trajectory (the learner passes
    the clipped ratios min(rho_clip, rho) as rho)."""
    terms = [np.asarray(x, np.float64) for x in (delta_mean, rho_mean, entropy_mean)]
    if not all(np.all(np.isfinite(t) & (t >= 0)) for t in terms):
        raise ValueError("priority terms (mean |delta|, mean rho, mean entropy) must be finite and >= 0")
    w1, w2, w3 = weights
    return w1 * terms[0] + w2 * terms[1] + w3 * terms[2] + eps


_COUNTS = ("added", "evicted_fifo", "dropped_stale", "sampled", "stale_updates")
_NEWER_COUNTS = ("added_at_max", "dropped_stale_at_add", "draws_resampled")
"""Counts a replay state saved by an older version may lack (restored as 0)."""
RECENT = 1000
"""Draws (and priority refreshes) over which `stats` reports resampled_share and priority_delta_corr."""


def initial_priority_terms(episode: Episode, gamma: float) -> tuple[float, float, float] | None:
    """The priority terms of an episode as it enters the replay, from the actor's own estimates
    (Episode.estimates, computed on the forward pass that chose each action), as Ape-X does (Horgan et
    al. 2018, section 3.1: actors compute initial priorities): (mean |delta_t|, 1, mean H).

    delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with V of a terminal state 0; the last step of a truncated
    episode has no V(s_L) at the actor and is left out of the mean. The ratio term is 1: to the actor the
    data is on-policy. None when the episode carries no estimates (the caller uses the running max)."""
    if not episode.estimates:
        return None
    value = episode.estimates["value"].astype(np.float64)
    reward = episode.steps["reward"].astype(np.float64)
    delta = reward[:-1] + gamma * value[1:] - value[:-1]
    if not episode.truncated:
        delta = np.append(delta, reward[-1] - value[-1])
    td = float(np.abs(delta).mean()) if delta.size else 0.0
    entropy = float(np.maximum(episode.estimates["entropy"], 0.0).mean())
    return td, 1.0, entropy


def oldest_version(episode: Episode) -> int:
    """The behavior version an episode is judged stale by: its oldest step's (see PrioritizedReplay)."""
    return int(episode.steps["policy_version"].min())


@dataclass
class ReplaySample(Generic[T]):
    """One batch drawn by `PrioritizedReplay.sample`, with what `update_priorities` needs to find its slots."""

    items: list[T]
    indices: np.ndarray  # slots, [B]; pass back with `generations` to update_priorities
    generations: np.ndarray  # the slots' generations when sampled, [B]
    weights: np.ndarray  # importance weights, [B], max 1 (all 1 when uniform)
    probs: np.ndarray  # P(i) of each draw, [B]
    beta: float


class PrioritizedReplay(Generic[T]):
    """A ring of `capacity` trajectories sampled in proportion to priority^alpha (see the module doc).

    - Sampling is stratified (Schaul et al. 2016, appendix B.2.1): the total mass is cut into B equal
      segments and one value is drawn uniformly in each, so every draw has marginal P(i) but the batch
      spreads over the buffer. Draws are with replacement (one item may fill several segments).
    - Importance weights are normalized by the batch maximum (Schaul's Algorithm 1): no min-tree to keep,
      and each batch's largest weight is exactly 1, so updates are only ever scaled down. N then cancels:
      w_i = (P(i) / min_batch P)^-beta.
    - beta = beta_start + (beta_end - beta_start) * min(1, progress / beta_steps), where progress is the
      learner's update count passed to `sample` (imitation updates included, so beta reaches 1 on the
      learner's clock), or this buffer's count of earlier samples when none is passed.
    - New items enter at the priority of the terms `add` is given (the actor's own estimates, see
      `initial_priority_terms`), else at the running max priority, which only grows (1.0 at first).
    - For the dashboards, over the last RECENT draws: the share that hit an item drawn before
      (`resampled_share`), the correlation between an item's priority when drawn and the mean |delta|
      its update then measured (`priority_delta_corr`: does the priority predict the TD error?), and
      each weighted term's spread (`priority_spread_*`: does it move priorities at all?).
    - Staleness: an item whose oldest behavior version is below policy_version - max_policy_lag is dropped
      (`dropped_stale`), so every trained step is at most max_policy_lag versions behind. Checked for all
      items when `sample`/`drop_stale` see a newer version, and at `add` against the last one seen
      (versions never decrease). 0 disables.
    - Eviction is FIFO and only when full; slots freed by stale drops are refilled first. Each slot has a
      generation that changes whenever its content does; updates with an old generation are ignored.
    - uniform=True stores 1 instead of p^alpha in the tree and returns unit weights (priorities still kept).
    Not thread-safe: one thread (the learner loop) owns it.
    """

    def __init__(
        self,
        capacity: int,
        alpha: float = 0.6,
        beta_start: float = 0.4,
        beta_end: float = 1.0,
        beta_steps: int = 100_000,
        priority_weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
        max_policy_lag: int = 0,
        uniform: bool = False,
        seed: int = 0,
        eps: float = 1e-6,
    ):
        if alpha < 0 or not 0 <= beta_start <= 1 or not 0 <= beta_end <= 1 or beta_steps < 0:
            raise ValueError("need alpha >= 0, beta_start and beta_end in [0, 1], beta_steps >= 0")
        if max_policy_lag < 0 or eps < 0 or len(priority_weights) != 3 or min(priority_weights) < 0:
            raise ValueError("need max_policy_lag >= 0, eps >= 0 and three priority weights >= 0")
        self.capacity, self.alpha, self.uniform, self.eps = capacity, alpha, uniform, eps
        self.beta_start, self.beta_end, self.beta_steps = beta_start, beta_end, beta_steps
        self.priority_weights, self.max_policy_lag = tuple(priority_weights), max_policy_lag
        self.tree = SumTree(capacity)
        self.priorities = np.zeros(capacity, np.float64)  # raw p per slot, 0 when empty
        self.max_priority = 1.0
        self._items: list[T | None] = [None] * capacity
        self._live = np.zeros(capacity, bool)
        self._generation = np.zeros(capacity, np.int64)
        self._version = np.zeros(capacity, np.int64)
        self._origin = np.full((capacity, 2), -1, np.int64)
        """Per slot, where its item can be read back: (write-ahead log record, episode index in it), or -1s
        when only memory holds it (a demonstration, a run without the log). Checkpoints save the log's
        items by this reference instead of their contents (learner/replay/file.py)."""
        self._free = list(range(capacity - 1, -1, -1))  # a stack: slot 0 is used first
        self._order: deque[tuple[int, int]] = deque()  # (slot, generation) by insertion, lazily pruned
        self._cutoff = -math.inf  # items with a version below this are stale
        self._rng = np.random.default_rng(seed)
        self.counts = dict.fromkeys((*_COUNTS, *_NEWER_COUNTS), 0)
        self._draws = np.zeros(capacity, np.int64)  # draws of each slot's current item
        self._recent_resampled: deque[bool] = deque(maxlen=RECENT)
        self._recent_pairs: deque[tuple[float, float]] = deque(maxlen=RECENT)
        self._recent_terms: deque[tuple[float, float, float]] = deque(maxlen=RECENT)
        self._progress = 0  # what beta anneals over (see the class docstring)

    def __len__(self) -> int:
        return self.capacity - len(self._free)

    @property
    def generations(self) -> np.ndarray:
        """Each slot's generation, [capacity] (read-only view)."""
        return _readonly(self._generation)

    @property
    def live(self) -> np.ndarray:
        """Which slots hold an item, [capacity] (read-only view)."""
        return _readonly(self._live)

    def items(self) -> list[T]:
        """The stored items, oldest first."""
        order = [s for s, g in self._order if self._generation[s] == g]
        return [self._items[s] for s in order]  # type: ignore[misc]

    @property
    def beta(self) -> float:
        """The beta the next `sample` call uses."""
        frac = min(1.0, self._progress / self.beta_steps) if self.beta_steps else 1.0
        return self.beta_start + (self.beta_end - self.beta_start) * frac

    def _leaf(self, p: np.ndarray | float) -> np.ndarray:
        return np.ones_like(p, np.float64) if self.uniform else np.power(p, self.alpha, dtype=np.float64)

    def add(
        self,
        item: T,
        behavior_version: int,
        priority_terms: tuple[float, float, float] | None = None,
        origin: tuple[int, int] = (-1, -1),
    ) -> int | None:
        """Store one trajectory at the priority of `priority_terms` (mean |delta|, mean rho, mean H), or at
        the running max priority without them; returns its slot, None if dropped as stale. `origin`: the
        write-ahead log record and index it was read from, if any."""
        if behavior_version < self._cutoff:
            self.counts["dropped_stale"] += 1
            self.counts["dropped_stale_at_add"] += 1
            return None
        if priority_terms is None:
            priority = self.max_priority
            self.counts["added_at_max"] += 1
        else:
            priority = float(trajectory_priority(*priority_terms, self.priority_weights, self.eps))
            self.max_priority = max(self.max_priority, priority)
        if not self._free:  # full: evict the oldest live item
            self._prune()
            self._clear(np.array([self._order.popleft()[0]]))
            self.counts["evicted_fifo"] += 1
        slot = self._free.pop()
        self._generation[slot] += 1
        self._items[slot], self._live[slot], self._version[slot] = item, True, behavior_version
        self._origin[slot] = origin
        self.priorities[slot] = priority
        self._draws[slot] = 0
        self.tree.set(slot, self._leaf(priority))
        self._order.append((slot, int(self._generation[slot])))
        self._prune()
        self.counts["added"] += 1
        return slot

    def _prune(self) -> None:
        """Forget dropped items in the insertion order: the oldest ones, and all once they are too many."""
        if len(self._order) > 2 * self.capacity:
            self._order = deque((s, g) for s, g in self._order if self._generation[s] == g)
        while self._order and self._generation[self._order[0][0]] != self._order[0][1]:
            self._order.popleft()

    def _clear(self, slots: np.ndarray) -> None:
        self.tree.set(slots, 0.0)
        self.priorities[slots] = 0.0
        self._live[slots] = False
        self._generation[slots] += 1
        for s in slots.tolist():
            self._items[s] = None
            self._free.append(s)

    def drop_stale(self, policy_version: int) -> int:
        """Drop items more than max_policy_lag versions behind policy_version; returns how many."""
        if not self.max_policy_lag or policy_version - self.max_policy_lag <= self._cutoff:
            return 0
        self._cutoff = policy_version - self.max_policy_lag
        stale = np.flatnonzero(self._live & (self._version < self._cutoff))
        self._clear(stale)
        self.counts["dropped_stale"] += len(stale)
        return len(stale)

    def sample(
        self, batch_size: int, policy_version: int | None = None, progress: int | None = None
    ) -> ReplaySample[T]:
        """Draw batch_size items (stratified, with replacement) after dropping stale ones; `progress` (the
        learner's update count) sets where beta is in its annealing."""
        if policy_version is not None:
            self.drop_stale(policy_version)
        if progress is not None:
            self._progress = progress
        total = self.tree.total
        if not len(self):
            raise ValueError("cannot sample from an empty replay buffer")
        if total <= 0:
            raise ValueError("every stored priority is 0 (use eps > 0)")
        beta = self.beta
        values = (np.arange(batch_size) + self._rng.random(batch_size)) * (total / batch_size)
        idx = self.tree.find_batch(values)
        probs = self.tree.leaves[idx] / total
        if self.uniform:
            weights = np.ones(batch_size)
        else:
            weights = (len(self) * probs) ** -beta
            weights /= weights.max()
        self._progress += 1
        self.counts["sampled"] += batch_size
        before = self._draws[idx] > 0
        self._recent_resampled.extend(before.tolist())
        self.counts["draws_resampled"] += int(before.sum())
        np.add.at(self._draws, idx, 1)
        items = [self._items[i] for i in idx.tolist()]
        return ReplaySample(items, idx, self._generation[idx].copy(), weights, probs, beta)  # type: ignore[arg-type]

    def update_priorities(self, indices, generations, delta_mean, rho_mean, entropy_mean) -> int:
        """Set p = w1 mean|delta| + w2 mean(rho) + w3 mean(H) + eps for sampled slots whose content
        is unchanged since sampling (others are counted in `stale_updates`); returns how many applied."""
        idx = np.asarray(indices, np.int64)
        p = np.broadcast_to(
            trajectory_priority(delta_mean, rho_mean, entropy_mean, self.priority_weights, self.eps),
            idx.shape,
        )
        ok = self._live[idx] & (self._generation[idx] == np.asarray(generations, np.int64))
        self.counts["stale_updates"] += int((~ok).sum())
        terms = [
            np.broadcast_to(np.asarray(t, np.float64), ok.shape)[ok]
            for t in (delta_mean, rho_mean, entropy_mean)
        ]
        self._recent_pairs.extend(zip(self.priorities[idx[ok]].tolist(), terms[0].tolist(), strict=True))
        self._recent_terms.extend(zip(*(t.tolist() for t in terms), strict=True))
        idx, p = _last_per_index(idx[ok], p[ok])
        if idx.size:
            self.priorities[idx] = p
            self.tree.set(idx, self._leaf(p))
            self.max_priority = max(self.max_priority, float(p.max()))
        return int(ok.sum())

    def state_dict(self) -> tuple[list[T], dict[str, Any]]:
        """The stored items oldest first and plain arrays and scalars: all `load_state_dict` needs to
        continue exactly as this buffer would (slots, generations, free stack, tree leaves, rng, counts)."""
        slots = np.array([s for s, g in self._order if self._generation[s] == g], np.int64)
        state = {
            "capacity": self.capacity,
            "slots": slots,  # of the items, oldest first
            "versions": self._version[slots],
            "priorities": self.priorities[slots],
            "leaves": self.tree.leaves[slots],  # p^alpha exactly as stored (1 when uniform)
            "generations": self._generation.copy(),  # every slot's, so old ones stay outdated
            "free": np.array(self._free, np.int64),  # the stack, bottom first
            "max_priority": self.max_priority,
            "cutoff": None if self._cutoff == -math.inf else int(self._cutoff),
            "sample_calls": self._progress,
            "counts": dict(self.counts),
            "draws": self._draws[slots],  # of each item
            "origins": self._origin[slots],  # of each item: (log record, index), -1s if none
            "recent_resampled": np.array(self._recent_resampled, np.int64),
            "recent_pairs": np.array(self._recent_pairs, np.float64).reshape(-1, 2),
            "recent_terms": np.array(self._recent_terms, np.float64).reshape(-1, 3),
            "rng": json.dumps(self._rng.bit_generator.state),
            "alpha": self.alpha,
            "uniform": self.uniform,
            "max_policy_lag": self.max_policy_lag,
        }
        return [self._items[s] for s in slots.tolist()], state  # type: ignore[misc]

    def load_state_dict(self, items: list[T], state: dict[str, Any]) -> None:
        """Replace this buffer's contents with a `state_dict()`, checking all of it before changing anything
        (a ValueError leaves the buffer as it was). The capacity must match. The other settings are this
        buffer's: with another alpha or uniform the tree is recomputed from the raw priorities, and with
        another max_policy_lag the stale cutoff restarts (the next `sample` sets it again)."""
        s = _checked_state(self, items, state)
        slots, rng = s["slots"], s["rng"]
        same_leaves = state.get("alpha") == self.alpha and state.get("uniform") == self.uniform
        leaves = s["leaves"] if same_leaves else self._leaf(s["priorities"])
        self.tree = SumTree(self.capacity)
        self.tree.set(slots, leaves)
        self.priorities[:] = 0.0
        self.priorities[slots] = s["priorities"]
        self._items = [None] * self.capacity
        for slot, item in zip(slots.tolist(), items, strict=True):
            self._items[slot] = item
        self._live[:] = False
        self._live[slots] = True
        self._generation[:] = s["generations"]
        self._version[:] = 0
        self._version[slots] = s["versions"]
        self._free = s["free"].tolist()
        self._order = deque(zip(slots.tolist(), s["generations"][slots].tolist(), strict=True))
        same_lag = state.get("max_policy_lag") == self.max_policy_lag
        self._cutoff = s["cutoff"] if same_lag else -math.inf
        self._rng, self.max_priority = rng, s["max_priority"]
        self.counts, self._progress = s["counts"], s["sample_calls"]
        self._draws[:] = 0
        self._draws[slots] = s["draws"]
        self._origin[:] = -1
        self._origin[slots] = s["origins"]
        self._recent_resampled = deque(s["recent_resampled"].astype(bool).tolist(), maxlen=RECENT)
        self._recent_pairs = deque(map(tuple, s["recent_pairs"].tolist()), maxlen=RECENT)
        self._recent_terms = deque(map(tuple, s["recent_terms"].tolist()), maxlen=RECENT)

    def stats(self) -> dict[str, float | int]:
        live = self.priorities[self._live]
        return {
            **self.counts,
            "size": len(self),
            "beta": self.beta,
            "max_priority": self.max_priority,
            "priority_min": float(live.min()) if live.size else 0.0,
            "priority_max": float(live.max()) if live.size else 0.0,
            "priority_mean": float(live.mean()) if live.size else 0.0,
            "resampled_share": float(np.mean(self._recent_resampled)) if self._recent_resampled else 0.0,
            "priority_delta_corr": _correlation(self._recent_pairs),
            **_spreads(self._recent_terms, self.priority_weights),
            "stale_dropped_share": self.counts["dropped_stale"]
            / max(1, self.counts["added"] + self.counts["dropped_stale_at_add"]),
        }


def _spreads(terms, weights) -> dict[str, float]:
    """Each weighted priority term's standard deviation over recent refreshes: how much it moves
    priorities (a term whose spread is tiny next to the others' barely steers sampling)."""
    std = np.array(terms, np.float64).std(axis=0) if terms else np.zeros(3)
    names = ("delta", "rho", "entropy")
    return {f"priority_spread_{n}": float(w * s) for n, w, s in zip(names, weights, std, strict=True)}


def _correlation(pairs) -> float:
    """Pearson correlation of (x, y) pairs; 0 when undefined (under 10 pairs, or one side constant)."""
    if len(pairs) < 10:
        return 0.0
    x, y = np.array(pairs, np.float64).T
    if x.std() == 0 or y.std() == 0:
        return 0.0
    return float(np.corrcoef(x, y)[0, 1])


def oldest_origin(replay: PrioritizedReplay) -> int | None:
    """The oldest write-ahead log record a stored item comes from (None if none does): the log must keep
    it, and every record after it, for a checkpoint that references them."""
    records = replay._origin[replay._live, 0]
    records = records[records >= 0]
    return int(records.min()) if len(records) else None


def _checked_state(replay: PrioritizedReplay, items: list, state: dict[str, Any]) -> dict[str, Any]:
    """The fields of a replay state dict, parsed and checked against `replay` (ValueError on any fault)."""
    if not isinstance(state, dict):
        raise ValueError(f"a replay state is a map, got {type(state).__name__}")
    cap = replay.capacity
    if _int(state, "capacity") != cap:
        raise ValueError(f"the replay state is for capacity {state['capacity']}, this buffer holds {cap}")
    n = len(items)
    s = {name: _array(state, name, np.int64, (n,)) for name in ("slots", "versions")}
    s |= {name: _array(state, name, np.float64, (n,)) for name in ("priorities", "leaves")}
    s["generations"] = _array(state, "generations", np.int64, (cap,))
    s["free"] = _array(state, "free", np.int64, (cap - n,))
    if not np.array_equal(np.sort(np.concatenate([s["slots"], s["free"]])), np.arange(cap)):
        raise ValueError("the replay state's item slots and free slots do not cover each slot once")
    for name in ("priorities", "leaves"):
        if not np.all(np.isfinite(s[name]) & (s[name] >= 0)):
            raise ValueError(f"the replay state's {name} must be finite and >= 0")
    s["max_priority"] = _number(state, "max_priority")
    if not (math.isfinite(s["max_priority"]) and s["max_priority"] > 0):
        raise ValueError("the replay state's max_priority must be finite and > 0")
    s["cutoff"] = -math.inf if state.get("cutoff") is None else _int(state, "cutoff")
    s["sample_calls"] = _int(state, "sample_calls")
    counts = state.get("counts")
    if not isinstance(counts, dict) or not set(_COUNTS) <= set(counts) <= set(replay.counts):
        raise ValueError(
            f"the replay state needs counts {sorted(_COUNTS)} (and may have {list(_NEWER_COUNTS)})"
        )
    s["counts"] = {k: _int(counts, k) if k in counts else 0 for k in replay.counts}
    s["rng"] = _rng(state.get("rng"))
    # Newer fields; a state saved before them counts every item as drawn before, with no recent history.
    s["draws"] = _array(state, "draws", np.int64, (n,)) if "draws" in state else np.ones(n, np.int64)
    no_origin = np.full((n, 2), -1, np.int64)
    s["origins"] = _array(state, "origins", np.int64, (n, 2)) if "origins" in state else no_origin
    widths = {"recent_resampled": (), "recent_pairs": (2,), "recent_terms": (3,)}
    recent = {k: np.zeros((0, *w), np.int64 if not w else np.float64) for k, w in widths.items()}
    recent |= {k: state[k] for k in recent if k in state}
    for name, width in widths.items():
        rows = min(len(recent[name]), RECENT) if isinstance(recent[name], np.ndarray) else -1
        s[name] = _array(recent, name, np.int64 if not width else np.float64, (rows, *width))
    return s


def _int(state: dict[str, Any], name: str) -> int:
    value = state.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"the replay state needs an integer {name}, got {value!r}")
    return value


def _number(state: dict[str, Any], name: str) -> float:
    value = state.get(name)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"the replay state needs a number {name}, got {value!r}")
    return float(value)


def _array(state: dict[str, Any], name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    value = state.get(name)
    kind = "iu" if dtype is np.int64 else "iuf"
    if not isinstance(value, np.ndarray) or value.dtype.kind not in kind or value.shape != shape:
        got = f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ValueError(
            f"the replay state's {name} must be a {np.dtype(dtype)} array of shape {shape}, got {got}"
        )
    return value.astype(dtype)


def _rng(blob: Any) -> np.random.Generator:
    """A PCG64 Generator in the state saved as JSON (the buffer's own is default_rng's PCG64)."""
    rng = np.random.default_rng(0)
    try:
        rng.bit_generator.state = json.loads(blob)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"the replay state's rng is not a PCG64 state: {e}") from e
    return rng
