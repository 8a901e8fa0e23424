"""One generation worker: continuous batching with a memory-bound decode step (docs/design.md §4).

Every decode step advances *all* active sequences by one token and costs `α + β·active`
seconds (divided by the worker's speed factor). So between two changes of the active set every
sequence progresses at the same rate, and the worker needs one number, the cumulative decode-step
counter `counter`: a sequence that joined at counter `c` with `r` tokens to go finishes when the
counter reaches `c + r`. Finish targets sit in a heap; only the earliest matters, and the next
completion time is recomputed only when this worker's active set (or stall) changes. This is what
makes the simulator fast: no per-token events.

Colocation (`sim.workers.colocated_slowdown`): while the trainer runs a step, the simulator sets
every worker's `slow` factor to 1 + slowdown, and back to 1 when the step ends. The counter is a
fluid measure of decode steps, so a rate change is exact at the instant it happens: a decode step
in progress runs its elapsed part at the old rate and its remainder at the new one (a real step in
flight when the trainer starts is slowed from that moment on, by contention, not retroactively).
`set_slow` brings the counter to `now` at the old rate before it changes; the simulator then
recomputes the next completion.

Compilation (`sim.workers.compile_s`, before the first decode step), prefill and weight loads
*stall* the worker (`stall_until`): its counter does not advance, as on a vLLM engine that runs a
prefill batch or loads weights between decode steps. Token versions are
tracked in *segments*: each running group samples on `SimGroup.version`, set at its start to the
worker's newest version; under partial rollout a load books every running group's tokens since the
last change to the old version and moves it to the new one; under drain nothing runs at a load.

Version-pinned generation (`sync_mode=pinned`, LoRA adapters: planner/types.py SYNC_MODES): a load
costs no swap time and moves no running group — each finishes on the version it started on, so all
its tokens carry that version, and new starts take the newest. The worker holds its newest version
and the versions its runs are pinned to, at most K = `resident_versions`: a load that would need a
(K+1)-th waits, holding new starts as drain does, until a pinned version frees (`can_load`). With
K = 1 that is drain at zero swap cost. Both wait kinds — drain's and pinned's — add to `held_total`
(seconds new starts were held for an update) and `update_waits` (loads that waited).

A hung attempt (`SimGroup.hangs`, the stall fault model) starts like any other — prefill, slots,
KV — but none of its sequences ever advances: it holds `stuck` slots and its KV until the
simulator's stall timeout aborts it.

Speculation (`sim.workers.speculation`, planner/sim/config.py SpeculationSimConfig): a run that
speculates (`SimGroup.fast`: every run under when=always, the groups the policy marked critical
under when=critical) counts its progress on a second counter, `scounter`: the tokens one such
sequence has emitted, which grows by the expected accepted run (1 − a^(k+1))/(1 − a) per decode
step while the worker is weight-bound (active <= max_active) and by 1 otherwise; its finish
targets sit in a second heap, `sseqs`. A step with a speculating sequence active costs
α·(1 + draft_cost·k) + β·active in that regime. Both counters advance together, so the fluid
model stays exact between changes. `scounter` only moves while a speculating sequence is active
(nothing reads it otherwise), so with speculation off every step and float is as before. Marking
a running group (`make_fast`) books its tokens so far, folds its per-trajectory progress into
`done_tok` (dropping a fraction of a token each, a simplification) and restarts its run on
`scounter` under a new run token (the old heap entries go stale).

Deliberate simplifications: a group starts only as a whole (all n trajectories, one shared
prefill); its KV reservation is its final footprint (prompt + all responses), released when the
whole group ends — no paging or preemption; the queue is strict priority order (head-of-line
blocking, as vLLM's priority scheduler).
"""

from __future__ import annotations

from heapq import heappop, heappush

from planner.sim.config import WorkerConfig
from planner.sim.group import SimGroup
from planner.types import GroupState

EPS = 1e-9


class Worker:
    __slots__ = (
        "index", "speed", "alpha", "beta", "prefill", "t_sync", "max_seqs", "kv_cap",
        "counter", "t_last", "stall_until", "active", "seqs", "runs", "queue", "kv_used",
        "version", "synced_version", "pending_version", "alive", "life", "epoch", "busy_since", "busy_total",
        "stuck", "slow", "stall_total", "_next_token",
        "pinned", "resident", "held_since", "held_total", "update_waits", "loads", "swap_total", "load_span",
        "max_resident",
        "spec_when", "spec_rate", "spec_alpha", "spec_k", "spec_budget", "scounter", "sseqs", "spec_active",
    )

    def __init__(self, index: int, cfg: WorkerConfig) -> None:
        self.index = index
        self.speed = cfg.speed(index)
        self.alpha = cfg.decode_alpha
        self.beta = cfg.decode_beta
        self.prefill = cfg.prefill_per_token
        self.t_sync = cfg.t_sync
        self.max_seqs = cfg.max_concurrency
        self.kv_cap = cfg.kv_capacity
        self.counter = 0.0  # cumulative decode steps
        self.t_last = 0.0  # time at which `counter` is exact
        self.stall_until = cfg.compile_s  # no decoding before this time (compile, prefill, weight load)
        self.stall_total = cfg.compile_s  # seconds of every stall so far, the queued ones included
        self.active = 0  # sequences decoding
        self.stuck = 0  # sequences of hung runs: they hold slots but never advance
        self.seqs: list[tuple[float, int]] = []  # heap of (finish counter, run token)
        self.runs: dict[int, SimGroup] = {}  # run token -> running group
        self.queue: list[tuple[float, int, SimGroup]] = []  # heap of (priority, seq, group)
        self.kv_used = 0
        self.version = 0  # weights that tag newly generated tokens
        self.synced_version = 0  # weights fully loaded (sync finished)
        self.pending_version: int | None = None  # drain / pinned: load once `can_load`
        self.pinned = cfg.sync_mode == "pinned"
        self.resident = cfg.resident  # K: versions held at once (pinned)
        self.held_since: float | None = None  # a pending update holds new starts since then
        self.held_total = 0.0  # seconds new starts were held for a pending update
        self.update_waits = 0  # loads that waited (drain: for in-flight work; pinned: for a resident slot)
        self.loads = 0  # weight updates applied
        self.swap_total = 0.0  # seconds spent swapping weights in (t_sync per load; 0 under pinned)
        self.load_span = (0.0, 0.0)  # (start, end) of the last load: when the new version is usable
        self.max_resident = 1  # most versions held at once
        self.alive = True
        self.life = 0  # bumps when the worker dies: its pending weight loads are void
        self.epoch = 0  # bumps on every reschedule; older completion events are stale
        self.busy_since: float | None = None
        self.busy_total = 0.0  # time with >= 1 active sequence
        self.slow = 1.0  # decode step cost multiplier: 1 + colocated_slowdown while the trainer trains
        self._next_token = 0
        spec = cfg.speculation
        self.spec_when = spec.when
        self.spec_rate = spec.rate  # tokens per decode step of a speculating sequence (weight-bound)
        self.spec_alpha = cfg.decode_alpha * spec.step_alpha_factor  # a speculating step's fixed cost
        self.spec_k = spec.tokens
        self.spec_budget = (spec.tokens + 1) * spec.max_active  # query positions of a weight-bound step
        self.scounter = 0.0  # cumulative tokens of one speculating sequence (moves while spec_active)
        self.sseqs: list[tuple[float, int]] = []  # heap of (finish scounter, run token) of fast runs
        self.spec_active = 0  # active sequences of fast runs

    # ------------------------------------------------------------------ time
    def advance(self, now: float) -> None:
        """Bring `counter` to time `now` (the active set has not changed since `t_last`)."""
        if self.active:
            start = self.t_last if self.t_last > self.stall_until else self.stall_until
            if now > start:
                if not self.spec_active:
                    self.counter += (now - start) * self.speed / ((self.alpha + self.beta * self.active) * self.slow)
                elif self.active + self.spec_k * self.spec_active <= self.spec_budget:  # weight-bound: they speculate
                    steps = (now - start) * self.speed / ((self.spec_alpha + self.beta * self.active) * self.slow)
                    self.counter += steps
                    self.scounter += steps * self.spec_rate
                else:
                    steps = (now - start) * self.speed / ((self.alpha + self.beta * self.active) * self.slow)
                    self.counter += steps
                    self.scounter += steps
        self.t_last = now

    def set_slow(self, now: float, factor: float) -> None:
        """Decode steps cost `factor`× from `now` on (the counter so far at the old rate); the
        caller reschedules the next completion."""
        self.advance(now)
        self.slow = factor

    def next_completion(self) -> float | None:
        """Time the earliest running sequence finishes, or None when nothing decodes."""
        seqs, runs = self.seqs, self.runs
        while seqs and seqs[0][1] not in runs:  # sequences of aborted runs
            heappop(seqs)
        if not self.active:
            return None
        start = self.t_last if self.t_last > self.stall_until else self.stall_until
        if not self.spec_active:
            return start + (seqs[0][0] - self.counter) * (self.alpha + self.beta * self.active) * self.slow / self.speed
        return start + self._steps_to_next() * self._step_s()

    def _spec_now(self) -> bool:
        """The fast runs speculate in the current step: it stays weight-bound (config.py)."""
        return self.active + self.spec_k * self.spec_active <= self.spec_budget

    def _step_s(self) -> float:
        alpha = self.spec_alpha if self._spec_now() else self.alpha
        return (alpha + self.beta * self.active) * self.slow / self.speed

    def _steps_to_next(self) -> float:
        """Decode steps until the earliest sequence of either heap finishes (spec_active > 0)."""
        seqs, sseqs, runs = self.seqs, self.sseqs, self.runs
        while seqs and seqs[0][1] not in runs:
            heappop(seqs)
        while sseqs and sseqs[0][1] not in runs:
            heappop(sseqs)
        plain = seqs[0][0] - self.counter if seqs else float("inf")
        fast = (sseqs[0][0] - self.scounter) / (self.spec_rate if self._spec_now() else 1.0) if sseqs else float("inf")
        return plain if plain < fast else fast

    def stall(self, now: float, seconds: float) -> None:
        self.stall_until = (self.stall_until if self.stall_until > now else now) + seconds
        self.stall_total += seconds

    def stalled_by(self, now: float) -> float:
        """Seconds this worker has stood still up to `now` (the tail analysis, planner/sim/tail_log.py).
        Exact: stalls queue one after another, so what is still to come is `stall_until − now`."""
        return self.stall_total - (self.stall_until - now if self.stall_until > now else 0.0)

    def _set_active(self, now: float, active: int) -> None:
        if active and not self.active:
            self.busy_since = now
        elif not active and self.active:
            self.busy_total += now - self.busy_since
            self.busy_since = None
        self.active = active

    def busy_time(self, now: float) -> float:
        return self.busy_total + (now - self.busy_since if self.busy_since is not None else 0.0)

    # ------------------------------------------------------------------ queue
    def load(self) -> float:
        """Routing key: sequences running or queued, per unit of speed."""
        return (self.active + len(self.queue)) / self.speed

    def enqueue(self, group: SimGroup) -> None:
        group.worker = self.index
        group.state = GroupState.QUEUED
        heappush(self.queue, (group.priority, group.seq, group))

    def start_queued(self, now: float) -> list[SimGroup]:
        """Start queued groups in priority order while slots and KV allow."""
        started = []
        queue = self.queue
        advanced = False
        while queue and self.pending_version is None:
            group = queue[0][2]
            if group.state != GroupState.QUEUED or group.worker != self.index:
                heappop(queue)  # dropped or re-routed while queued
                continue
            if group.min_version > self.version:
                break  # its start barrier: wait for newer weights (strict priority order)
            rem = [l - d for l, d in zip(group.lengths, group.done_tok)]
            n = sum(1 for r in rem if r > 0)
            kv = group.prompt_tokens + sum(group.lengths)
            held = self.active + self.stuck
            if held and (held + n > self.max_seqs or self.kv_used + kv > self.kv_cap):
                break
            heappop(queue)
            if not advanced:
                self.advance(now)
                advanced = True
            self._start(now, group, rem, n, kv)
            started.append(group)
        return started

    def _start(self, now: float, group: SimGroup, rem: list[int], n: int, kv: int, version: int | None = None) -> None:
        """Start `group` on this worker, sampling on the newest version (or `version`: a pinned
        group migrated here keeps its own)."""
        first_run = group.token == -1
        assert version is None or version in self.resident_versions(), \
            f"worker {self.index} holds versions {sorted(self.resident_versions())}: cannot run group {group.uid} on {version}"
        group.version = self.version if version is None else version
        token = self._next_token
        self._next_token += 1
        prefix = sum(group.done_tok)
        self.stall(now, (group.prompt_tokens + prefix) * self.prefill / self.speed)
        group.state = GroupState.RUNNING
        group.token = token
        group.rem = rem
        fast = not group.hangs and (self.spec_when == "always" or (self.spec_when == "critical" and group.critical))
        group.fast = fast
        counter, heap = (self.scounter, self.sseqs) if fast else (self.counter, self.seqs)
        group.base = group.seg_base = counter
        group.remaining = n
        for r in rem:
            if r > 0:
                if not group.hangs:
                    heappush(heap, (counter + r, token))
            elif first_run:
                group.last_versions.append(group.version)  # an empty response: done at once
        if n == 0:  # nothing to generate (empty responses): done at start
            group.state = GroupState.DONE
            return
        if group.hangs:  # holds its slots and KV; no sequence advances (no finish target, no tokens)
            group.rem = [0] * len(rem)
            group.remaining = 0
            group.stuck = n
            self.stuck += n
            group.kv = kv
            self.kv_used += kv
            self.runs[token] = group
            return
        group.kv = kv
        self.kv_used += kv
        self.runs[token] = group
        if self.pinned:
            self.max_resident = max(self.max_resident, len(self.resident_versions()))
        if fast:
            self.spec_active += n
        self._set_active(now, self.active + n)

    def make_fast(self, now: float, group: SimGroup) -> bool:
        """Group `group`, running here, speculates from `now` on (when=critical marked it).

        Its tokens so far are booked to the current version and its per-trajectory progress folds
        into `done_tok`; the run continues on `scounter` under a new run token. Returns False (and
        changes nothing) for a run that is hung, already fast or has nothing left to decode; the
        caller reschedules the worker's next completion otherwise."""
        if group.fast or group.stuck or not group.remaining:
            return False
        self.advance(now)
        self._book(group, group.run_tokens(self.counter))
        steps = max(0, int(self.counter - group.base + EPS))
        # Its `remaining` unfinished trajectories are its longest (all advance alike); the others
        # ended. Choosing them by length, not by the floored progress, keeps the count exact.
        order = sorted(range(len(group.rem)), key=lambda i: -group.rem[i])
        unfinished = set(order[:group.remaining])
        rem = []
        for i, r in enumerate(group.rem):
            done = min(r, steps) if i in unfinished else r
            group.done_tok[i] += done
            rem.append(r - done)
        del self.runs[group.token]  # its entries in `seqs` go stale
        token = self._next_token
        self._next_token += 1
        self.runs[token] = group
        group.token, group.rem, group.fast = token, rem, True
        group.base = group.seg_base = self.scounter
        for i in unfinished:  # one due at this very instant (rem 0) finishes at the next completion
            heappush(self.sseqs, (self.scounter + rem[i], token))
        self.spec_active += group.remaining
        return True

    # ------------------------------------------------------------------ progress
    def complete(self, now: float) -> list[SimGroup]:
        """The earliest sequence finished (the engine checked the epoch): pop every sequence that is
        done by now and return the groups whose last trajectory ended."""
        self.advance(now)
        if self.spec_active:
            return self._complete_both(now)
        seqs, runs = self.seqs, self.runs
        if self.counter < seqs[0][0]:
            self.counter = seqs[0][0]  # exact: the event was computed for this target
        finished: list[SimGroup] = []
        self._set_active(now, self._pop_done(seqs, self.counter + EPS, finished, self.active))
        return finished

    def _complete_both(self, now: float) -> list[SimGroup]:
        """`complete` with fast runs active: snap both counters to the earliest target, pop both heaps."""
        steps = self._steps_to_next()
        if steps > 0:  # exact: the event was computed for this target
            self.counter += steps
            self.scounter += steps * (self.spec_rate if self._spec_now() else 1.0)
        finished: list[SimGroup] = []
        active = self._pop_done(self.seqs, self.counter + EPS, finished, self.active)
        self._set_active(now, self._pop_done(self.sseqs, self.scounter + EPS, finished, active, fast=True))
        return finished

    def _pop_done(self, seqs: list[tuple[float, int]], limit: float, finished: list[SimGroup], active: int,
                  fast: bool = False) -> int:
        """Pop the sequences of `seqs` done by `limit`, appending the groups whose last trajectory
        ended; returns `active` less the popped sequences."""
        runs = self.runs
        while seqs and seqs[0][0] <= limit:
            _, token = heappop(seqs)
            group = runs.get(token)
            if group is None:
                continue
            active -= 1
            if fast:
                self.spec_active -= 1
            group.last_versions.append(group.version)
            group.remaining -= 1
            if group.remaining == 0:
                del runs[token]
                self.kv_used -= group.kv
                self._book(group, sum(group.rem))
                group.state = GroupState.DONE
                finished.append(group)
        return active

    def _book(self, group: SimGroup, run_tokens: int) -> int:
        """Book the run's tokens since the segment start to the version it samples on; returns them."""
        tokens = run_tokens - group.run_tokens(group.seg_base)
        if tokens:
            group.versions[group.version] = group.versions.get(group.version, 0) + tokens
        group.seg_base = self.scounter if group.fast else self.counter
        return tokens

    def resident_versions(self) -> set[int]:
        """The versions this worker holds: its newest and every one a run samples on."""
        return {self.version, *(g.version for g in self.runs.values())}

    def can_load(self) -> bool:
        """A pending update may load now: drain, once no sequence decodes; pinned, while the
        versions runs are pinned to leave one of the K resident slots for the new one."""
        if self.pinned:
            return len({g.version for g in self.runs.values()}) < self.resident
        return not self.active

    def hold(self, now: float, version: int) -> None:
        """Update `version` waits for `can_load`; new starts are held meanwhile (drain / pinned)."""
        self.pending_version = version
        if self.held_since is None:
            self.held_since = now

    def _release(self, now: float) -> None:
        """The held update loaded, or the worker died: the seconds starts were held are counted."""
        if self.held_since is not None:
            if now > self.held_since:
                self.held_total += now - self.held_since
                self.update_waits += 1
            self.held_since = None

    def apply_version(self, now: float, version: int) -> list[tuple[SimGroup, int, int]]:
        """Load weights `version`. Partial: book in-flight tokens to the old version, move the
        runs to the new one and stall t_sync; drain: nothing runs, stall t_sync; pinned: runs keep
        their versions, no stall. Returns (group, old version, tokens) for every running group
        that generated tokens."""
        self.advance(now)
        self._release(now)
        booked = []
        if not self.pinned:
            for group in self.runs.values():
                tokens = self._book(group, group.run_tokens(self.scounter if group.fast else self.counter))
                if tokens:
                    booked.append((group, group.version, tokens))
                group.version = version
        self.version = version
        self.pending_version = None
        self.loads += 1
        if self.pinned:
            self.load_span = (now, now)
            self.max_resident = max(self.max_resident, len(self.resident_versions()))
        else:
            self.stall(now, self.t_sync)
            self.swap_total += self.t_sync
            self.load_span = (self.stall_until - self.t_sync, self.stall_until)
        return booked

    def abort(self, now: float, group: SimGroup) -> int:
        """Stop a running group; its tokens so far are booked (the caller decides if they are wasted).
        Returns the tokens booked to the current version."""
        self.advance(now)
        counter = self.scounter if group.fast else self.counter
        booked = self._book(group, group.run_tokens(counter))
        for i, r in enumerate(group.rem):
            group.done_tok[i] += min(r, max(0, int(counter - group.base + EPS)))
        del self.runs[group.token]
        self.kv_used -= group.kv
        if group.fast:
            self.spec_active -= group.remaining
        self._set_active(now, self.active - group.remaining)
        group.remaining = 0
        self.stuck -= group.stuck
        group.stuck = 0
        return booked

    def kill(self, now: float) -> tuple[list[tuple[SimGroup, int, int]], list[SimGroup]]:
        """The worker dies: returns ((group, version, tokens booked) of running groups, queued groups)."""
        running = []
        for group in sorted(self.runs.values(), key=lambda g: g.token):
            running.append((group, group.version, self.abort(now, group)))
        queued = [g for _, _, g in sorted(self.queue) if g.state == GroupState.QUEUED and g.worker == self.index]
        self.queue.clear()
        self.seqs.clear()
        self.alive = False
        self.life += 1
        self.pending_version = None
        self._release(now)
        self.epoch += 1
        return running, queued

    def revive(self, now: float, version: int) -> None:
        """A restarted worker loads the newest weights before it decodes."""
        self.alive = True
        self.version = self.synced_version = version
        self.stall(now, self.t_sync)
