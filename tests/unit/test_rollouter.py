"""The rollouter's wiring: its row ledger, its supervision of row tasks, and the episode context the run injects.

The control code is real (Rollouter, RowLedger, StalenessManager, MessageQueue, WeightSync, Run, the HTTP
gateway); engines and trainer are the simulator's. The edges faked: a queue whose `put` fails for one row,
and an episode context that records what it was asked for.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses

import httpx
import pytest

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import PauseMode
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync.rollout.rollouter import RolloutCrashedError, Rollouter, RolloutSettings, RowOutcome
from fullasync.rollout.staleness import StalenessManager
from fullasync.run.assemble import assemble
from fullasync.run.queue import MessageQueue
from fullasync.run.runner import RunSettings
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.sim.trainer import SimulatedTrainer, TrainCost

COST = DecodeCost(step_base_s=1e-4, step_per_seq_s=0.0, max_num_seqs=16, push_s=1e-3)
SETTINGS = RolloutSettings(n=2, max_running_rows=4, episode_timeout_s=1e6)


def service_on(engines: list[SimulatedEngine]) -> RolloutService:
    return RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))


async def answer(client, row) -> float:
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=row["length"],
                                    extra_body={"ignore_eos": True})
    return float(client.episode.id.endswith("/0"))


def rows(count: int, length: int = 8):
    return ((f"row-{i}", {"length": length}) for i in range(count))


class QueueThatFailsFor(MessageQueue):
    """Edge fake: `put` fails for one row, as a queue actor that died would."""

    def __init__(self, max_size: int, row_id: str) -> None:
        super().__init__(max_size)
        self.row_id = row_id

    async def put(self, group) -> None:
        if group.row_id == self.row_id:
            raise ConnectionError("the queue actor is gone")
        await super().put(group)


def test_a_row_crash_ends_every_row_at_once_and_is_handed_to_the_supervisor():
    async def main() -> tuple[RolloutCrashedError, Rollouter]:
        engines = [SimulatedEngine("sim-0", COST)]
        staleness = StalenessManager(100, 2, 4, version=lambda: 0)
        rollouter = Rollouter(answer, service_on(engines), QueueThatFailsFor(1000, "row-3"), staleness, SETTINGS)
        rollouter.start(rows(40))
        crash = await asyncio.wait_for(rollouter.wait_crashed(), 60)
        await rollouter.stop()
        return crash, rollouter

    crash, rollouter = run_virtual(main)
    assert "row row-3" in str(crash) and "the queue actor is gone" in str(crash)
    assert isinstance(crash.__cause__, ConnectionError)
    assert rollouter.exhausted and not rollouter.ledger.running  # the other rows ended with it
    assert "row-3" not in rollouter.outcomes  # the crashed row has no outcome: the run fails
    assert set(rollouter.outcomes.values()) <= {RowOutcome.QUEUED, RowOutcome.UNFINISHED}
    assert rollouter.staleness.counts.running == 0
    try:
        rollouter.check()
    except RolloutCrashedError as raised:
        assert raised is crash
    else:
        raise AssertionError("check() must raise the crash")


def test_a_duplicate_row_id_crashes_the_dispatcher_naming_the_id():
    async def main() -> RolloutCrashedError:
        staleness = StalenessManager(100, 2, 4, version=lambda: 0)
        rollouter = Rollouter(answer, service_on([SimulatedEngine("sim-0", COST)]), MessageQueue(100), staleness,
                              SETTINGS)
        rollouter.start([("a", {"length": 4}), ("a", {"length": 4})])
        return await asyncio.wait_for(rollouter.wait_crashed(), 60)

    assert "row id 'a' appears twice" in str(run_virtual(main))


def test_the_ledger_keeps_one_record_per_running_row_and_a_snapshot_reads_it():
    async def main() -> None:
        staleness = StalenessManager(100, 2, 4, version=lambda: 0)
        queue = MessageQueue(100)
        rollouter = Rollouter(answer, service_on([SimulatedEngine("sim-0", COST)]), queue, staleness, SETTINGS)
        rollouter.start(rows(10, length=200))
        while not rollouter.ledger.running:
            await asyncio.sleep(1e-3)
        await asyncio.sleep(0.01)  # some tokens generated, no episode finished
        state = rollouter.snapshot()
        assert set(state.in_flight) == set(rollouter.ledger.running)
        assert state.admitted == len(rollouter.ledger.running) + len(rollouter.outcomes)
        for record in rollouter.ledger.running.values():
            assert record.task is not None and not record.task.done()
            assert set(record.running) == set(range(SETTINGS.n)) and not record.finished
        while not rollouter.exhausted:
            await asyncio.sleep(0.1)
        rollouter.check()
        assert not rollouter.ledger.running and rollouter.outcomes == {f"row-{i}": RowOutcome.QUEUED for i in range(10)}
        assert rollouter.report().outcome_counts == {"queued": 10}
        assert staleness.counts.running == 0 and staleness.counts.started == 10

    run_virtual(main)


class RecordingGenerator(CustomGenerator):
    """A generator that answers in process and records the context each episode got."""

    def __init__(self) -> None:
        self.contexts: list[EpisodeContext] = []

    async def generate(self, episode: EpisodeContext, row) -> float:
        self.contexts.append(episode)
        return await answer(episode.client, row)


def test_an_injected_episode_context_is_opened_and_closed_around_every_episode():
    opened: list[str] = []
    closed: list[str] = []

    @contextlib.contextmanager
    def episode_context(client):
        opened.append(client.episode.id)
        try:
            yield EpisodeContext(client.episode.id, client, f"http://example/{client.episode.id}", "key")
        finally:
            closed.append(client.episode.id)

    async def main(generator: RecordingGenerator, with_context: bool) -> None:
        staleness = StalenessManager(100, 2, 4, version=lambda: 0)
        rollouter = Rollouter(generator, service_on([SimulatedEngine("sim-0", COST)]), MessageQueue(100), staleness,
                              SETTINGS, episode_context=episode_context if with_context else None)
        rollouter.start(rows(3))
        while not rollouter.exhausted:
            await asyncio.sleep(0.1)
        rollouter.check()

    injected = RecordingGenerator()
    run_virtual(lambda: main(injected, True))
    assert sorted(opened) == sorted(closed) == sorted(f"row-{r}/{e}" for r in range(3) for e in range(2))
    assert {c.base_url for c in injected.contexts} == {f"http://example/{episode}" for episode in opened}
    in_process = RecordingGenerator()
    run_virtual(lambda: main(in_process, False))
    assert len(in_process.contexts) == 6 and all(c.base_url is None for c in in_process.contexts)


class Announced(RecordingGenerator):
    """Records each row announced ahead (`coming`) and, per episode, which rows had been announced by its start."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fail = fail
        self.announced: list[tuple[object, int]] = []
        self.known_at_start: list[tuple[str, list[object]]] = []

    def coming(self, row, episodes: int) -> None:
        self.announced.append((row, episodes))
        if self.fail:
            raise RuntimeError("preparing failed")

    async def generate(self, episode: EpisodeContext, row) -> float:
        self.known_at_start.append((episode.episode_id, [known for known, _ in self.announced]))
        return await super().generate(episode, row)


@pytest.mark.parametrize("fail", [False, True])
def test_each_row_is_announced_to_the_generator_before_its_episodes_start(fail):
    generator = Announced(fail)

    async def main() -> None:
        staleness = StalenessManager(2, 2, 4, version=lambda: 0)  # room for one row's episodes at a time
        rollouter = Rollouter(generator, service_on([SimulatedEngine("sim-0", COST)]), MessageQueue(100), staleness,
                              SETTINGS)
        rollouter.start((f"row-{i}", row) for i, row in enumerate(listed))
        while not rollouter.exhausted:
            await asyncio.sleep(0.1)
        rollouter.check()

    listed = [{"length": 8, "index": i} for i in range(4)]
    run_virtual(main)
    assert generator.announced == [(row, SETTINGS.n) for row in listed]  # once each, in order, with its episodes
    for episode_id, known in generator.known_at_start:
        assert listed[int(episode_id.split("/")[0].removeprefix("row-"))] in known
    assert len(generator.contexts) == 4 * SETTINGS.n  # a coming() that raises stops nothing


class OverHTTP(CustomGenerator):
    """A harness that reaches its episode only through the base URLs it is given: its own (a row's first episode), the
    run's one with the episode's key in X-Session-ID (the others)."""

    uses_gateway = True

    def __init__(self) -> None:
        self.base_urls: list[str] = []
        self.run_base_urls: set[str | None] = set()

    async def generate(self, episode: EpisodeContext, row) -> float:
        assert episode.base_url is not None and episode.api_key is not None
        self.base_urls.append(episode.base_url)
        self.run_base_urls.add(episode.run_base_url)
        run_wide = not episode.episode_id.endswith("/0") and episode.run_base_url is not None
        async with httpx.AsyncClient(base_url=episode.run_base_url if run_wide else episode.base_url, timeout=30,
                                     headers={"X-Session-ID": episode.api_key} if run_wide else {}) as http:
            reply = await http.post("/completions", json={"model": "policy", "prompt": [1, 2, 3], "max_tokens": 4,
                                                          "ignore_eos": True})
        reply.raise_for_status()
        return float(len(reply.json()["choices"][0]["text"]) >= 0)


def test_the_run_owns_the_gateway_of_a_harness_that_uses_one(tmp_path):
    async def main(rollout_fn) -> tuple:
        engines = [SimulatedEngine("sim-0", COST)]
        settings = RunSettings(max_staleness=1, batch_size=2, total_steps=2, queue_in_process=True, rollout=SETTINGS)
        run = await assemble(engines=engines, trainer=SimulatedTrainer(TrainCost(1e-4, 1e-3), 1),
                             service=service_on(engines), rollout_fn=rollout_fn, settings=settings,
                             sink=MetricsSink(tmp_path / "m.jsonl"))
        try:
            result = await run.execute(rows(8))
        finally:
            await asyncio.gather(*(e.shutdown() for e in engines))
        return run, result

    harness = OverHTTP()
    run, result = asyncio.run(main(harness))
    assert result.steps == 2 and result.episode_failures == 0
    gateway = run.gateway
    # 404 only for an episode the run's end cancelled while its request ran (the gateway records nothing of it)
    assert gateway is not None and set(gateway.answered) <= {200, 404}
    assert gateway.answered[200] >= 2 * 2 * SETTINGS.n  # every episode of the trained rows, at least
    assert len(set(harness.base_urls)) == len(harness.base_urls)  # one base URL per episode
    assert all(url.startswith(gateway.url) for url in harness.base_urls)
    assert harness.run_base_urls == {gateway.run_base_url}  # and the run's one, where a harness keeps one client
    assert gateway._http is None  # stopped when the run ended
    plain, _ = asyncio.run(main(answer))
    assert plain.gateway is None  # a plain function needs no gateway


def test_what_a_harness_logs_reaches_the_step_metrics(tmp_path):
    import pytest

    async def logging_harness(client, row) -> float:
        await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=row["length"],
                                        extra_body={"ignore_eos": True})
        client.log("tool_errors", 1)
        client.log("tool_errors", 3.0)
        client.log("submitted", True)
        with pytest.raises(ValueError, match="finite number"):
            client.log("broken", float("inf"))
        with pytest.raises(ValueError, match="non-empty string"):
            client.log(" ", 1.0)
        return 1.0

    async def main():
        engines = [SimulatedEngine("sim-0", COST)]
        settings = RunSettings(max_staleness=1, batch_size=2, total_steps=2, queue_in_process=True, rollout=SETTINGS)
        sink = MetricsSink(tmp_path / "m.jsonl")
        run = await assemble(engines=engines, trainer=SimulatedTrainer(TrainCost(1e-4, 1e-3), 1),
                             service=service_on(engines), rollout_fn=logging_harness, settings=settings, sink=sink)
        try:
            return await run.execute(rows(8))
        finally:
            await asyncio.gather(*(e.shutdown() for e in engines))

    result = run_virtual(main)
    assert result.steps == 2 and result.episode_failures == 0
    for step in result.history:  # 2 groups x 2 episodes per step, each logged twice / once
        assert step["harness/tool_errors/count"] == 8 and step["harness/tool_errors/mean"] == 2.0
        assert step["harness/submitted/mean"] == 1.0 and step["harness/submitted/count"] == 4


@pytest.mark.parametrize("stop_stale_rows", [True, False])
def test_every_row_that_ran_is_accounted_with_what_it_generated(stop_stale_rows):
    async def varied(client, row) -> float:  # long and short episodes: some rows outlast the bound and are dropped
        await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=row["length"],
                                        extra_body={"ignore_eos": True})
        return float(client.episode.id.endswith("/0"))

    async def main():
        engines = [SimulatedEngine("sim-0", DecodeCost(step_base_s=1e-3, step_per_seq_s=0.0, max_num_seqs=4,
                                                       push_s=1e-3))]
        settings = RunSettings(max_staleness=1, batch_size=2, total_steps=6, queue_in_process=True,
                               rollout=dataclasses.replace(SETTINGS, stop_stale_rows=stop_stale_rows))
        run = await assemble(engines=engines, trainer=SimulatedTrainer(TrainCost(1e-4, 1e-3), 1),
                             service=service_on(engines), rollout_fn=varied, settings=settings,
                             sink=MetricsSink(None))
        try:
            result = await run.execute((f"row-{i}", {"length": 400 if i % 3 == 0 else 8}) for i in range(60))
        finally:
            await asyncio.gather(*(e.shutdown() for e in engines))
        return run, result

    run, result = run_virtual(main)
    records = {r["row_id"]: r for r in run.rollouter.ledger.row_records()}
    assert set(records) == set(result.row_outcomes)  # every row that ran, once
    assert {r["outcome"] for r in records.values()} == set(result.row_outcomes.values())
    trained = [r for r in records.values() if r["outcome"] == "trained"]
    assert len(trained) == 6 * 2 and all(r["episodes"] == SETTINGS.n and r["calls"] == SETTINGS.n for r in trained)
    assert sum(r["output_tokens"] for r in trained) == sum(step["rollout/output_tokens"] for step in result.history)
    stale = [r for r in records.values() if r["outcome"] == "too_stale"]
    assert stale
    if stop_stale_rows:  # stopped in their one call, once no later batch could take them: no completed call
        assert all(r["calls"] == 0 and r["output_tokens"] == 0 for r in stale)
    else:  # a group dropped at hand-over keeps what it generated
        assert any(r["episodes"] == SETTINGS.n and r["output_tokens"] > 0 for r in stale)


async def two_calls(client, row) -> float:
    """A one-token call (its version is then known), then a long one."""
    for max_tokens in (1, row["length"]):
        await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=max_tokens,
                                        extra_body={"ignore_eos": True})
    return float(client.episode.id.endswith("/0"))


class RecordingEngine(SimulatedEngine):
    """A simulated engine that keeps every request it is given (to read their priorities)."""

    def __init__(self, name: str, cost: DecodeCost) -> None:
        super().__init__(name, cost)
        self.requests = []

    async def generate(self, request):
        self.requests.append(request)
        return await super().generate(request)


@pytest.mark.parametrize("taken_at, stopped", [(0, False), (1, True)])
def test_a_row_only_the_batch_just_taken_could_train_stops_when_that_batch_is_taken(taken_at, stopped):
    # k = 1, trainer at version 1: rows holding version-0 tokens are still trainable by the batch of version 1;
    # once that batch is taken the next trains at version 2, which cannot take them
    version = [0]

    async def main():
        engines = [SimulatedEngine("sim-0", COST)]
        staleness = StalenessManager(1, 2, 4, version=lambda: version[0])
        rollouter = Rollouter(two_calls, service_on(engines), MessageQueue(100), staleness, SETTINGS)
        rollouter.start(rows(2, length=4000))
        await asyncio.sleep(0.1)  # both rows are in their long call, with version-0 tokens on record
        version[0] = 1
        rollouter.on_version(1)  # the bound at version 1 still takes version 0: nothing stops
        assert rollouter.rows_stopped_stale == 0
        rollouter.on_batch_taken(taken_at)
        await asyncio.sleep(0.01)
        in_flight = await engines[0].num_in_flight()
        outcomes = dict(rollouter.outcomes)
        await rollouter.stop()
        await engines[0].shutdown()
        return rollouter, in_flight, outcomes

    rollouter, in_flight, outcomes = run_virtual(main)
    if stopped:
        assert rollouter.rows_stopped_stale == 2 and in_flight == 0  # their engine slots are free at once
        assert outcomes == {"row-0": RowOutcome.TOO_STALE, "row-1": RowOutcome.TOO_STALE}
    else:
        assert rollouter.rows_stopped_stale == 0 and in_flight == 2 * SETTINGS.n and outcomes == {}


def test_each_request_carries_its_rows_oldest_token_version_as_its_priority():
    version = [0]

    async def main():
        engines = [RecordingEngine("sim-0", COST)]
        # k = 0, B = 2: rows 0 and 1 are admitted at version 0, rows 2 and 3 once the version moves
        staleness = StalenessManager(0, 2, 4, version=lambda: version[0])
        settings = dataclasses.replace(SETTINGS, stop_stale_rows=False)  # rows 0 and 1 go on generating
        rollouter = Rollouter(two_calls, service_on(engines), MessageQueue(100), staleness, settings)
        rollouter.start(rows(4, length=4000))
        await asyncio.sleep(0.1)  # rows 0 and 1 are in their long calls
        version[0] = 3  # admission opens for rows 2 and 3 at version 3, whose first call runs at version 0 still
        rollouter.on_version(3)
        await asyncio.sleep(0.01)  # they start: their one-token calls run on the engine's version-0 weights
        await engines[0].pause(PauseMode.ABORT)  # a push: every call is resubmitted, its row older than it
        await engines[0].update_weights({}, version=3)
        await engines[0].resume()
        await asyncio.sleep(0.1)
        requests = list(engines[0].requests)
        await rollouter.stop()
        await engines[0].shutdown()
        return requests

    priorities: dict[str, list[int]] = {}
    for request in run_virtual(main):
        priorities.setdefault(request.request_id.split("/")[0], []).append(request.priority)
    # rows 0 and 1: admitted at 0, then holding version-0 tokens; rows 2 and 3: admitted at version 3, their first
    # calls sampled at version 0 (the engine had not been pushed yet), so their resubmissions rank by that
    assert set(priorities) == {"row-0", "row-1", "row-2", "row-3"}
    assert all(set(p) == {0} for row, p in priorities.items() if row in ("row-0", "row-1"))
    for row in ("row-2", "row-3"):
        assert priorities[row][:SETTINGS.n] == [3] * SETTINGS.n and set(priorities[row][SETTINGS.n:]) == {0}


def test_outcome_counts_follow_every_change_of_a_rows_outcome_and_a_restore():
    from fullasync.rollout.ledger import RowLedger

    ledger = RowLedger(keep_tracebacks=1)
    for i in range(5):
        ledger.mark(f"row-{i}", RowOutcome.QUEUED)
    ledger.mark("row-0", RowOutcome.TRAINED)
    ledger.mark("row-1", RowOutcome.TOO_STALE)
    ledger.mark("row-0", RowOutcome.TRAINED)  # twice: counted once, reported as trained twice
    expected = {"queued": 3, "trained": 1, "too_stale": 1}
    assert ledger.outcome_counts() == expected and ledger.trained_twice == ["row-0"]
    assert ledger.outcome_counts() == dict(collections.Counter(o.value for o in ledger.outcomes.values()))
    restored = RowLedger(keep_tracebacks=1)
    restored.restore(ledger.snapshot({}))
    assert restored.outcome_counts() == expected
