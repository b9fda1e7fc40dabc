"""Runs one simulated training run through the real control code and measures where time went.

Owns: running simulated engines and a simulated trainer through the real control code, wired by
`fullasync.run.assemble` exactly as `AsyncAgentTrainer` wires a run (`Rollouter`, `StalenessManager`,
`MessageQueue`, `WeightSync`, `RolloutService` / `RolloutClient`, `TrainingLoop`) — with the queue
in process because the clock is virtual — and turning their counters into a `SimResult` over the
steady-state window: throughput, staleness, where device time went, the driver's CPU (less the
simulated engines' own) and, on request, the event loop's replayed lag. The simulated agent takes
`workload.turns` calls per episode (tool latency between them). With `SimSpec.peer`, another
framework's admission, queue and push rules replace ours (`peers.py`).
Does not own: the cost model (`engine.py`, `trainer.py`), the bound (`workload.py`) or the peers' rules.

Devices: `sync` generates on all N devices, then trains on all N (colocated, alternating);
`one_step_off` and `fully_async` generate on G devices and train on N − G, concurrently.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import math
import random
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fullasync.client import ClientConfig, RolloutClient, RolloutService
from fullasync.config import Mode, RunConfig
from fullasync.contracts.engine import PauseMode
from fullasync.infra.heap import settled_heap
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.generator import RolloutFunction
from fullasync.rollout.rollouter import RolloutSettings, RowOutcome
from fullasync.run.assemble import assemble
from fullasync.run.result import LoopResult
from fullasync.run.runner import RunSettings
from fullasync.sim import peers
from fullasync.sim.clock import VirtualClockLoop, run_virtual
from fullasync.sim.engine import EngineTime, SimulatedEngine
from fullasync.sim.loop_lag import LoopWork, replayed_lag, tick_cost_s
from fullasync.sim.peers import PeerPolicy
from fullasync.sim.trainer import SimulatedTrainer
from fullasync.sim.workload import Workload, split_bound


class SimTokenizer:
    """The few tokenizer methods `RolloutService` touches, for token-id prompts (no text is ever made)."""

    chat_template = "simulated"
    eos_token_id = 0
    eos_token = ""
    vocab_size = 2**31  # any token id is valid

    def __len__(self) -> int:
        return self.vocab_size

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return ""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1] * max(1, len(text) // 4)

    def apply_chat_template(self, conversation: list[Mapping[str, object]], *, tools: list[object] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = False, **kwargs: object) -> str:
        """The messages' contents one per line (a simulated chat is only ever measured, never read)."""
        return "\n".join(str(message.get("content") or "") for message in conversation)


@dataclass(frozen=True)
class SimSpec:
    """One run: the mode and its knobs, and how many devices generate."""

    mode: str
    partial_rollout: bool = True
    max_staleness: int = -1
    gen_devices: int = 0  # G for split modes; ignored by sync (all N)
    steps: int = 14
    warmup_steps: int = 3  # excluded from the steady-state window (pipeline fill)
    running_rows_per_capacity: float = 1.5  # max_running_rows = this × engine slots / n
    admission: str = "episodes"  # how running rows count toward max_running_rows (StalenessManager)
    hand_over: str = "oldest"  # the queue's hand-over order (MessageQueue)
    generate_ahead: str = RunConfig.generate_ahead  # adaptive lead, or the bound's (StalenessManager)
    pause_mode: str = ""  # abort | keep | wait: how a push meets generations ("" = the mode's own)
    peer: PeerPolicy | None = None  # another framework's admission/queue/push rules instead of ours (sim.peers)
    lag_sample_s: float = 0.0  # > 0: record the loop's work; sample its replayed lag every this many simulated s
    stop_stale_rows: bool = True  # RolloutSettings.stop_stale_rows (peers turn it off: they train those rows)
    bind_late: bool = True  # RunSettings.bind_late (peers turn it off: their batches are taken whole)

    def run_config(self) -> RunConfig:
        # RunConfig.validate() would also resolve the (real) trainer's registry names against verl;
        # the simulated trainer has no such knobs, so only the mode and its staleness are checked.
        config = RunConfig(mode=Mode(self.mode).value, max_staleness=self.max_staleness,
                           partial_rollout=self.partial_rollout)
        fixed = {Mode.SYNC.value: 0, Mode.ONE_STEP_OFF.value: 1}.get(config.mode)
        if fixed is not None and self.max_staleness not in (-1, fixed):
            raise ValueError(f"max_staleness={self.max_staleness} contradicts mode={self.mode} (always {fixed})")
        return config

    @property
    def label(self) -> str:
        if self.peer is not None:
            return self.peer.label
        if self.mode != Mode.FULLY_ASYNC.value:
            return self.mode
        pause = f" {self.pause_mode}" if self.pause_mode else ""
        return f"fully_async{'+partial' if self.partial_rollout else ''}{pause} k={self.run_config().staleness}"


@dataclass
class SimResult:
    """Measurements of one run over its steady-state window (steps warmup+1 .. steps)."""

    spec: SimSpec
    gen_devices: int
    train_devices: int
    window_s: float
    samples: int
    tokens: int
    wall_s: float  # whole run, from the first admitted row to the last step
    total_samples: int
    mean_staleness: float
    max_staleness: int
    dropped_rows: int  # inside the window
    wasted_tokens: int  # decoded for the rows dropped as too stale inside the window (stopped rows: until stopped)
    engine: EngineTime  # summed over generation devices, over the window
    fresh_prefill_tokens: int
    train_s: float
    push_pause_s: float  # inside WeightSync.pause: waiting for engines to drain (WAIT) or abort
    push_update_s: float
    resumed_calls: int
    cpu_s: float  # real CPU seconds the run took (control code + simulation)
    bound_samples_per_s: float = 0.0  # X(G) of this split
    episodes: int = 0  # episodes finished inside the window
    # real CPU seconds inside the window, less the simulated engines' own and the lag record's
    driver_cpu_s: float = 0.0
    engine_cpu_s: float = 0.0  # real CPU seconds of the simulated engines' event handling inside the window
    loop_lag_s: tuple[float, ...] = ()  # replayed loop lag inside the window, every spec.lag_sample_s (loop_lag.py)
    loop_iterations: int = 0  # event-loop iterations inside the window (when recorded)
    stopped_stale_rows: int = 0  # whole run: rows stopped while generating because their group could only be dropped
    staleness_histogram: Mapping[int, float] = dataclasses.field(default_factory=dict)  # gap -> share of trained tokens
    final_lead_batches: float = 0.0  # how far admission ran ahead of training at the last step, in batches
    # whole run, rows trained or dropped as too stale, in deciles of their planned output tokens (shortest first):
    # the share of each decile that was dropped
    dropped_share_by_length: tuple[float, ...] = ()

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.window_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.window_s

    @property
    def thrown_away_share(self) -> float:
        """Share of the window's decoded tokens that went to rows dropped as too stale."""
        return self.wasted_tokens / self.engine.tokens if self.engine.tokens else 0.0

    @property
    def gen_idle_fraction(self) -> float:
        """Share of generation-device time with nothing decoding (idle, or paused for a push)."""
        total = self.engine.total_s()
        return (self.engine.idle_s + self.engine.paused_s) / total if total else 0.0

    @property
    def trainer_idle_fraction(self) -> float:
        """Share of the trainer's window not spent training (waiting for a batch, or blocked in a push)."""
        return max(0.0, 1.0 - self.train_s / self.window_s)


@dataclass
class _Counters:
    """What the simulated harness did (counted by the harness, not by the control code under test)."""

    episodes_started: int = 0
    episodes_finished: int = 0
    fresh_prefill_tokens: int = 0  # prompt tokens of every call, once (a resubmission's prefill is re-prefill)


@dataclass(frozen=True)
class _Mark:
    """The counters at the end of one step; a window is the difference of two marks."""

    time_s: float
    engine: EngineTime
    train_s: float
    counters: _Counters
    dropped: frozenset[str]
    process_cpu_s: float
    engine_cpu_s: float
    loop_iterations: int


def row_token(row_id: str) -> int:
    """A token id of its own for each row (stable across processes: no salted `hash`)."""
    return 1000 + zlib.crc32(row_id.encode()) % 2**30


def _rollout_fn(workload: Workload, counters: _Counters) -> RolloutFunction:
    """The simulated agent: `workload.turns` calls, each extending the last call's context by its output
    and `observation_tokens` of tool output after `workload.tool_latency`; a deterministic 0/1 reward. A row's
    prompt is its own (its first token names the row: a prefix cache shares it between the row's samples only)."""

    async def rollout_fn(client: RolloutClient, row: Mapping[str, float]) -> float:
        episode = client.episode.id
        counters.episodes_started += 1
        prompt = [row_token(episode.rsplit("/", 1)[0]), *[1] * (workload.prompt_tokens - 1)]
        for turn in range(workload.turns(episode)):
            if turn:
                await asyncio.sleep(workload.tool_latency(episode, turn))
                prompt = [*client.episode.calls[-1].all_ids, *[1] * workload.observation_tokens]
            counters.fresh_prefill_tokens += len(prompt)
            await client.completions.create(model="policy", prompt=prompt,
                                            max_tokens=workload.turn_length(episode, turn),
                                            extra_body={"ignore_eos": True})
        counters.episodes_finished += 1
        return float(random.Random(episode).random() < row["difficulty"])

    return rollout_fn


class _RecordingSink(MetricsSink):
    """A metrics sink that keeps each step's metrics in memory and snapshots engine and trainer counters at each
    step (for the window); it writes no file."""

    def __init__(self, on_step: Callable[[int], None]) -> None:
        super().__init__(path=None)
        self.history: list[dict[str, float]] = []
        self._on_step = on_step

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self.history.append(dict(metrics))
        self._on_step(step)


def _snapshot(engines: list[SimulatedEngine]) -> EngineTime:
    total = EngineTime()
    for engine in engines:
        engine.account_until_now()
        for name in vars(total):
            setattr(total, name, getattr(total, name) + getattr(engine.time, name))
    return total


def _minus(a: EngineTime, b: EngineTime) -> EngineTime:
    return EngineTime(**{name: getattr(a, name) - getattr(b, name) for name in vars(a)})


async def _simulate(workload: Workload, spec: SimSpec) -> SimResult:
    config = spec.run_config()
    k, batch, n = config.staleness, workload.batch_groups, workload.group_size
    sync = Mode(config.mode) is Mode.SYNC
    gen_devices = workload.devices if sync else spec.gen_devices
    train_devices = workload.devices if sync else workload.devices - spec.gen_devices
    if not sync and not 0 < gen_devices < workload.devices:
        raise ValueError(f"gen_devices={gen_devices} must leave devices for training (N={workload.devices})")
    loop = asyncio.get_running_loop()
    engines = [SimulatedEngine(f"sim-{i}", workload.decode) for i in range(gen_devices)]
    trainer = SimulatedTrainer(workload.train, train_devices)
    slots = gen_devices * workload.decode.max_num_seqs
    max_running = math.ceil(spec.running_rows_per_capacity * slots / n)
    service = RolloutService(engines, SimTokenizer(), ClientConfig(
        model_name="policy", max_model_len=workload.max_context + 1, resume_timeout_s=1e6))
    counters = _Counters()
    rows = ((f"row-{i}", {"difficulty": random.Random(i).random()}) for i in itertools.count())
    work = None
    if spec.lag_sample_s > 0:
        if not isinstance(loop, VirtualClockLoop):
            raise TypeError("SimSpec.lag_sample_s > 0 replays the loop's lag, which needs a VirtualClockLoop "
                            "(run the simulation with run_virtual), or set lag_sample_s = 0")
        work = loop.record_work()
    marks: dict[int, _Mark] = {}

    def on_step(step: int) -> None:
        outcomes = run.rollouter.outcomes
        marks[step] = _Mark(loop.time(), _snapshot(engines), trainer.time.train_s, dataclasses.replace(counters),
                            frozenset(r for r, outcome in outcomes.items() if outcome is RowOutcome.TOO_STALE),
                            time.process_time(), sum(e.cpu_s for e in engines), work.mark() if work else 0)

    sink = _RecordingSink(on_step)
    peer = spec.peer
    per_sync = peer.steps_per_sync if peer is not None else 1
    settings = RunSettings(
        max_staleness=k, batch_size=batch // per_sync, total_steps=spec.steps * per_sync,
        push_mode=peer.push_mode if peer is not None else
        PauseMode(spec.pause_mode) if spec.pause_mode else config.push_mode,
        rollout=RolloutSettings(n=n, max_running_rows=max_running, episode_timeout_s=1e9,
                                stop_stale_rows=spec.stop_stale_rows),
        admission=spec.admission, hand_over=spec.hand_over, generate_ahead=spec.generate_ahead, queue_in_process=True,
        bind_late=spec.bind_late)
    run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=_rollout_fn(workload, counters),
                         settings=settings, sink=sink)
    if peer is not None:
        peers.install(run, peer, settings.batch_size)
    cpu_start = time.process_time()
    started = loop.time()
    try:
        with settled_heap():  # as the real driver runs
            result = await run.execute(rows)
    finally:
        await asyncio.gather(*(e.shutdown() for e in engines))
    history = sink.history[spec.warmup_steps * per_sync:]
    decoded = sum((engine.decoded_by_row for engine in engines), collections.Counter[str]())
    measured = _window_result(workload, spec, marks[spec.warmup_steps * per_sync], marks[spec.steps * per_sync],
                              history, work, decoded, gen_devices=gen_devices, train_devices=train_devices,
                              wall_s=loop.time() - started, cpu_s=time.process_time() - cpu_start, loop_result=result)
    return dataclasses.replace(measured, stopped_stale_rows=run.rollouter.rows_stopped_stale,
                               dropped_share_by_length=_dropped_by_length(workload, run.rollouter.outcomes))


def _window_result(workload: Workload, spec: SimSpec, first: _Mark, last: _Mark, window: list[dict[str, float]],
                   work: LoopWork | None, decoded: Mapping[str, int], *, gen_devices: int, train_devices: int,
                   wall_s: float, cpu_s: float, loop_result: LoopResult) -> SimResult:
    """The run's measurements between two step marks."""
    dropped = last.dropped - first.dropped  # rows dropped as too stale inside the window
    sync = Mode(spec.run_config().mode) is Mode.SYNC
    engine_cpu_s = last.engine_cpu_s - first.engine_cpu_s
    # the loop-lag record reads the CPU clock once per loop iteration: measurement, not driver work
    instrument_cpu_s = (last.loop_iterations - first.loop_iterations) * tick_cost_s() if work is not None else 0.0
    return SimResult(
        spec=spec, gen_devices=gen_devices, train_devices=train_devices, window_s=last.time_s - first.time_s,
        samples=int(sum(m["rollout/samples"] for m in window)),
        tokens=int(sum(m["train/tokens"] for m in window)),
        wall_s=wall_s, total_samples=loop_result.trained_samples,
        mean_staleness=sum(m["staleness/mean"] for m in window) / len(window),
        staleness_histogram=_staleness_histogram(window),
        final_lead_batches=window[-1]["rollout/lead_batches"],
        max_staleness=loop_result.max_token_staleness,
        dropped_rows=len(dropped),
        wasted_tokens=sum(decoded.get(row_id, 0) for row_id in dropped),
        engine=_minus(last.engine, first.engine),
        fresh_prefill_tokens=last.counters.fresh_prefill_tokens - first.counters.fresh_prefill_tokens,
        train_s=last.train_s - first.train_s,
        push_pause_s=sum(m["weight_sync/pause_s"] for m in window),
        push_update_s=sum(m["weight_sync/update_s"] for m in window),
        resumed_calls=int(sum(m["rollout/resumed_calls"] for m in window)),
        cpu_s=cpu_s,
        bound_samples_per_s=split_bound(workload, gen_devices) if not sync else 0.0,
        episodes=last.counters.episodes_finished - first.counters.episodes_finished,
        driver_cpu_s=last.process_cpu_s - first.process_cpu_s - engine_cpu_s - instrument_cpu_s,
        engine_cpu_s=engine_cpu_s,
        loop_lag_s=tuple(replayed_lag(work, first.loop_iterations, last.loop_iterations, spec.lag_sample_s)
                         if work is not None else ()),
        loop_iterations=last.loop_iterations - first.loop_iterations,
    )


def _dropped_by_length(workload: Workload, outcomes: Mapping[str, RowOutcome],
                       deciles: int = 10) -> tuple[float, ...]:
    """Of the rows trained or dropped as too stale, sorted by the output tokens their episodes were to generate, the
    share dropped in each tenth (the length bias of the staleness bound)."""
    ended = sorted((sum(workload.output_tokens(f"{row_id}/{i}") for i in range(workload.group_size)),
                    outcome is RowOutcome.TOO_STALE)
                   for row_id, outcome in outcomes.items() if outcome in (RowOutcome.TRAINED, RowOutcome.TOO_STALE))
    if len(ended) < deciles:
        return ()
    bounds = [len(ended) * d // deciles for d in range(deciles + 1)]
    return tuple(sum(dropped for _, dropped in ended[lo:hi]) / (hi - lo) for lo, hi in itertools.pairwise(bounds))


def _staleness_histogram(window: list[dict[str, float]]) -> dict[int, float]:
    """Share of the window's generated tokens trained at each staleness gap (steps weighted by their tokens)."""
    prefix = "staleness/frac_gap_"
    tokens: dict[int, float] = {}
    for metrics in window:
        for key, share in metrics.items():
            if key.startswith(prefix):
                gap = int(key[len(prefix):])
                tokens[gap] = tokens.get(gap, 0.0) + share * metrics["rollout/output_tokens"]
    total = sum(tokens.values())
    return {gap: count / total for gap, count in sorted(tokens.items())} if total else {}


def simulate(workload: Workload, spec: SimSpec) -> SimResult:
    """Run one simulated training run on a fresh virtual-clock event loop."""
    return run_virtual(lambda: _simulate(workload, spec))
