"""When the learner imitates, trains, publishes and stops: every rule of the loop's timing in one place."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from learner.config import LearnerConfig

RECENT_UPDATES = 4
"""How many recent updates' durations the time limit's guard remembers (`UpdateTimes`)."""


@dataclass
class UpdateTimes:
    """Wall seconds of the run's last RECENT_UPDATES updates, drawing their batch included."""

    recent: list[float] = field(default_factory=list)

    def finished(self, seconds: float) -> None:
        self.recent = [*self.recent[-(RECENT_UPDATES - 1) :], seconds]

    def expected_s(self) -> float:
        """What the next update is expected to take: the longest of the recent ones (0 before the first).
        The time limit stops the run this much early rather than in the middle of an update that would
        end past it (an LM update takes a minute on 2 cores; the pointer policy's, milliseconds)."""
        return max(self.recent, default=0.0)


@dataclass
class Schedule:
    """The rules, each a method, so the loop only asks:

    - **Imitation** (`imitates`): with demonstrations, updates 0 .. warmup_updates - 1 are behavior
      cloning (the warm-up, which --warmup-patience may end early: `warmup_end`); after it, every
      demo_update_every-th update is one more. An imitation update needs no replay data, so it is always
      ready.
    - **Sample side of the rate limit** (`can_train`): a reinforcement-learning update needs a full local
      batch in the replay, and may not sample more than samples_per_insert times per inserted episode on
      average (Reverb's SampleToInsertRatio); it waits for new episodes otherwise. Both sides count
      `inserted`: episodes from actors, never the demonstrations.
    - **Insert side** (`accepts_inserts`, the ingest's gate, --insert-slack, on by default with local
      actors): actors get no new credit while their episodes run more than the slack ahead of what
      reinforcement learning has used, unless it could train right now (closing then would wedge it: it
      needs data to catch up). During an imitation warm-up each imitation update counts as a batch used,
      so actors collect at training's pace; that credit ends when reinforcement learning starts
      (`start_rl`).
    - **Async** (DistRL): train whenever ready; publish a new version every publish_every updates.
    - **Sync** (DigiRL's loop): a round ends when every connected environment has delivered its episode
      (`on_episodes`, `round_complete`), or sync_round_timeout seconds after the round's first episode
      (counted in `rounds_timed_out`). The learner then trains on it as long as the rate limit allows and
      publishes, which starts the next round (`next_round`). The warm-up happens before the first round ends.
    - **Stop** (`stop_reason`): the time limit (early by what the next update is expected to take, so
      none ends past it), the update limit, or the success target (--stop-at-success: the last 100
      episodes all came after the warm-up and succeed often enough).
    """

    cfg: LearnerConfig
    local_batch: int
    """This process's rows of a batch: what one update samples from its replay."""
    has_demos: bool
    """Demonstrations were loaded (the warm-up and imitation updates need them)."""
    start: float = 0.0
    """When the run started (time.monotonic()), for the time limit."""
    rl_updates: int = 0
    """Reinforcement-learning updates made by this run (not restored: the rate limit counts this run's
    inserts)."""
    imitation_updates: int = 0
    """Imitation updates made by this run (the warm-up's pace the insert side: `used`)."""
    inserted: int = 0
    """Episodes from actors this run stored in the replay (`count_inserts`; those the write-ahead log
    recovers at a resume included): the inserts of the rate limit. Not the demonstrations: they join the
    replay as data when reinforcement learning starts but are no new experience (counted, they gave a run
    about 50 updates on demonstrations alone). Not restored either: a resumed run's budget starts at 0
    updates on 0 inserts, whatever its restored replay holds."""
    rounds: int = 0
    """--mode sync: rounds completed."""
    rounds_timed_out: int = 0
    """--mode sync: rounds ended by sync_round_timeout rather than by every environment delivering."""
    used: float = 0.0
    """Episodes the insert side counts as used (`accepts_inserts`): a batch per reinforcement-learning
    update over samples_per_insert, and per imitation update of the warm-up, so that actors keep
    collecting at the pace of training, with the policy they are sent, rather than stopping at the slack.
    When reinforcement learning starts (`start_rl`) at most what had come in: counted for ever, a
    60-minute lm warm-up's 554 updates let actors run 1,108 episodes ahead, so the slack never closed and
    two actors took the learner's cores for episodes it never drew (153 received, 58 drawn; BENCHMARKS.md
    "LM agent: the insert side after the warm-up"). Later imitation updates draw no actor data."""
    rl_started: bool = False
    """`start_rl` was called: the warm-up's imitation updates no longer pace the insert side."""
    warmup_end: int | None = None
    """The update the warm-up ended at when it ended early (--warmup-patience: learner/warmup.py sets it,
    in this run or one before it in the same directory); None: it runs its --warmup-updates."""
    update_times: UpdateTimes = field(default_factory=UpdateTimes)
    """What this run's last few updates took: the time limit stops early by what the next is expected to."""
    _round_episodes: int = 0
    _round_first_at: float = 0.0
    _round_late: bool = False

    @property
    def sync(self) -> bool:
        return self.cfg.mode == "sync"

    @property
    def warmup_updates(self) -> int:
        """The warm-up's length in updates: --warmup-updates, or fewer when it ended early."""
        planned = self.cfg.imitation.warmup_updates
        return planned if self.warmup_end is None else min(planned, self.warmup_end)

    def in_warmup(self, update: int) -> bool:
        return self.has_demos and update < self.warmup_updates

    def phase(self, update: int) -> str:
        """ "warmup" during the imitation warm-up, "rl" after it (metrics.jsonl's "phase")."""
        return "warmup" if self.in_warmup(update) else "rl"

    def imitates(self, update: int) -> bool:
        """Whether update number `update` (0-based) is behavior cloning on the demonstrations."""
        every = self.cfg.imitation.demo_update_every
        after = update - self.warmup_updates
        return self.in_warmup(update) or bool(self.has_demos and every and after % every == every - 1)

    def can_train(self, stored: int) -> bool:
        """The sample side: `stored` episodes in the replay now (demonstrations included: they are data),
        at most samples_per_insert draws per episode `inserted` by actors."""
        spi = self.cfg.buffer.samples_per_insert
        return stored >= self.local_batch and (self.rl_updates + 1) * self.local_batch <= spi * self.inserted

    def accepts_inserts(self, received: int, stored: int) -> bool:
        """The insert side: False while the `received` episodes run more than the insert slack ahead of
        what the updates have `used`, as long as it could train right now."""
        return received - self.used <= self.cfg.insert_slack() or not self.can_train(stored)

    def start_rl(self, received: int) -> None:
        """Reinforcement learning started with `received` episodes from actors in (Session.start_rl, every
        turn after the warm-up: only the first call counts): the warm-up's pace ends (`used`)."""
        if not self.rl_started:
            self.rl_started, self.used = True, min(float(received), self.used)

    def count_inserts(self, count: int) -> None:
        """`count` more episodes from actors are stored in the replay (both sides of the rate limit)."""
        self.inserted += count

    def beta_progress(self, update: int) -> int:
        """Where the replay's beta is in its annealing (PrioritizedReplay.sample's `progress`): the update
        count, or with a time limit the share of it passed times --beta-steps when that is further, so
        beta reaches 1 by the end of a time-limited run however few updates the machine makes."""
        steps, limit = self.cfg.buffer.beta_steps, self.cfg.time_limit
        if not limit or not steps:
            return update
        return max(update, int(steps * (time.monotonic() - self.start) / limit))

    def count_update(self, imitation: bool) -> None:
        """One more update drew its batch: of demonstrations (`imitation`) or from the replay (both sides of
        the rate limit count it); an imitation update is `used` on the insert side during the warm-up only."""
        if imitation:
            self.imitation_updates += 1
        else:
            self.rl_updates += 1
        if not (imitation and self.rl_started):
            self.used += self.local_batch / self.cfg.buffer.samples_per_insert

    def publishes_after(self, update: int) -> bool:
        """Async: a new version after every publish_every-th update (sync publishes at round ends)."""
        return not self.sync and update % self.cfg.publish_every == 0

    def on_episodes(self, count: int) -> None:
        """--mode sync: `count` episodes of the current round arrived."""
        if self.sync and count:
            self._round_episodes += count
            self._round_first_at = self._round_first_at or time.monotonic()

    def round_complete(self, connected_envs: int) -> bool:
        """--mode sync: every connected environment has delivered its episode of this round, or the round
        has waited sync_round_timeout seconds since its first episode."""
        if not self._round_episodes:
            return False
        if self._round_episodes >= connected_envs:
            return True
        if time.monotonic() - self._round_first_at >= self.cfg.sync_round_timeout:
            self.rounds_timed_out += not self._round_late
            self._round_late = True
            return True
        return False

    def next_round(self) -> None:
        """--mode sync: the round's data is used up and a new version is out: the next round starts."""
        self.rounds += 1
        self._round_episodes, self._round_first_at, self._round_late = 0, 0.0, False

    def stop_reason(self, update: int, success_reached: bool) -> str:
        """Why the run should stop now ("" to go on); `success_reached` is RunStats.success_reached's answer."""
        if self.cfg.stop_at_success and success_reached:
            return "success target"
        if self.cfg.max_updates and update >= self.cfg.max_updates:
            return "update limit"
        if (
            self.cfg.time_limit
            and time.monotonic() - self.start + self.update_times.expected_s() >= self.cfg.time_limit
        ):
            return "time limit"
        return ""
