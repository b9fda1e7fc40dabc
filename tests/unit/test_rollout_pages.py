"""`fullasync report`'s rollout pages (fullasync.cli.rollout_pages) from episodes written by `RolloutSamples`: each
episode's calls, the completion's tokens coloured by the weight version that sampled them, a mark where a resume
changed the version, and the filters' choices. (A real run's pages in a real browser: tests/integration/
test_learning.py.)"""

from __future__ import annotations

import json
from html.parser import HTMLParser

from fullasync.cli.report import write_report
from fullasync.observe.samples import RolloutSamples
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup


class Spans(HTMLParser):
    """The coloured token spans of a page, as (version, style, text)."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[list[str]] = []
        self._open: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and attrs.get("class") == "tokens":
            self._open = [attrs["data-version"], attrs["style"], ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[2] += data

    def handle_endtag(self, tag):
        if tag == "span" and self._open is not None:
            self.spans.append(self._open)
            self._open = None


class Words:
    """A decoder that shows each id: `[10, 11]` -> "w10 w11 "."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"w{i} " for i in ids)


def call(outputs: list[int], versions: list[int], resumes: int = 0) -> ModelCall:
    return ModelCall(prompt_ids=(1, 2, 3), output_ids=tuple(outputs), output_logprobs=(-0.5,) * len(outputs),
                     output_versions=tuple(versions), finish_reason=FinishReason.STOP, num_resumes=resumes)


def test_each_episode_shows_its_calls_with_tokens_coloured_by_version_and_resumes_marked(tmp_path):
    samples = RolloutSamples(tmp_path / "rollouts", Words(), every=1)
    resumed = Trajectory(calls=(call([10, 11, 12, 13], [3, 3, 4, 4], resumes=1),), reward=1.0)
    failed = Trajectory(calls=(call([20, 21], [4, 4]),), reward=0.0, metadata={"failure": "model", "turns": 2})
    samples.write(6, [TrajectoryGroup("row-7", (resumed, failed))], trainer_version=5)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 6, "reward/mean": 0.5}) + "\n")

    index = write_report(tmp_path)
    assert "rollouts/index.html" in index.read_text()  # linked from the curves' page
    assert "<a href='step_6.html'>6</a>" in (tmp_path / "report" / "rollouts" / "index.html").read_text()
    page = (tmp_path / "report" / "rollouts" / "step_6.html").read_text()
    spans = Spans()
    spans.feed(page)
    assert [(version, text) for version, _, text in spans.spans] == [("3", "w10 w11 "), ("4", "w12 w13 "),
                                                                     ("4", "w20 w21 ")]
    colours = {version: style for version, style, _ in spans.spans}
    assert colours["3"] != colours["4"]  # staleness 2 and 1 at the trainer's version 5
    assert page.count("class='resume'") == 1 and "⟳ v4" in page  # where the resumed call's version changed
    assert "data-failure='model'" in page and "data-failure='none'" in page
    assert "<option value='model'>model</option>" in page and "turns 2" in page
    assert "row row-7" in page and page.count("class='episode'") == 2
