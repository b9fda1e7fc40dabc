"""`fullasync report`'s rollout pages: the sampled episodes (`rollouts/step_N.jsonl`) as pages a person reads.

Owns: `write_rollout_pages`, which writes `rollouts/index.html` under the report folder (the sampled steps: their
episodes, mean reward, failures, staleness) and `rollouts/step_N.html` per sampled step: every episode with its
row, reward, failure kind, staleness and harness metrics, and its calls — the prompt (folded; a long one shows its
end), the completion with each token coloured by the weight version that sampled it (a call resumed under newer
weights shows a mark where the version changes), finish reason and token counts. The filters (reward, failure
kind, staleness) run in the page, also from a link's query (`step_N.html?min-reward=1&staleness=2`): static
files that open from disk, also from a live run's folder. Does not own:
what is sampled (`fullasync.observe.samples`), the curves (`fullasync.cli.report`).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from fullasync.observe.samples import Record

PROMPT_CHARS = 4000  # a prompt's end shown; a long agent conversation's start is in the jsonl
GAP_HUES = (130, 55, 30)  # green, yellow, orange for staleness 0, 1, 2; red beyond

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; } td, th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
.episode { border: 1px solid #bbb; border-radius: 6px; margin: 1em 0; padding: 0.5em 1em; }
.episode h3 { margin: 0.2em 0; font-size: 15px; }
.call { border-top: 1px dashed #ccc; margin-top: 0.5em; padding-top: 0.4em; }
.completion, .prompt { white-space: pre-wrap; font-family: ui-monospace, monospace; font-size: 13px; }
.prompt { color: #555; background: #f6f6f6; padding: 0.3em; }
.resume { background: #333; color: #fff; border-radius: 3px; padding: 0 3px; font-size: 11px; }
.legend span { padding: 1px 6px; margin-right: 6px; border-radius: 3px; }
.meta { color: #555; font-size: 12px; }
#filters { position: sticky; top: 0; background: #fff; padding: 0.5em 0; border-bottom: 1px solid #ccc; }
"""

FILTER_SCRIPT = """
function applyFilters() {
  const minReward = parseFloat(document.getElementById('min-reward').value);
  const failure = document.getElementById('failure').value;
  const staleness = document.getElementById('staleness').value;
  let shown = 0;
  for (const episode of document.querySelectorAll('.episode')) {
    const ok = (isNaN(minReward) || parseFloat(episode.dataset.reward) >= minReward)
      && (failure === 'any' || episode.dataset.failure === failure)
      && (staleness === 'any' || episode.dataset.staleness === staleness);
    episode.style.display = ok ? '' : 'none';
    if (ok) shown += 1;
  }
  document.getElementById('shown').textContent = shown;
}
const asked = new URLSearchParams(location.search);  // a link may carry filters: ?min-reward=1&failure=none
for (const id of ['min-reward', 'failure', 'staleness']) {
  if (asked.has(id)) document.getElementById(id).value = asked.get(id);
  document.getElementById(id).addEventListener('input', applyFilters);
}
applyFilters();
"""


def gap_colour(gap: int) -> str:
    """The background of tokens `gap` versions behind the trainer's at their step."""
    hue = GAP_HUES[gap] if 0 <= gap < len(GAP_HUES) else 0
    return f"hsl({hue}, 75%, 84%)"


def read_sampled_steps(rollouts: Path) -> dict[int, list[Record]]:
    """Every sampled step's episodes, by step (a step being written is skipped: files appear whole)."""
    steps = {}
    for path in rollouts.glob("step_*.jsonl"):
        stem = path.stem.removeprefix("step_")
        if stem.isdigit():
            steps[int(stem)] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return dict(sorted(steps.items()))


def _staleness(episode: Record) -> int | None:
    gaps = [call["staleness"] for call in episode["calls"] if call.get("staleness") is not None]
    return max(gaps) if gaps else None


def _failure(episode: Record) -> str:
    return str(episode.get("metadata", {}).get("failure") or "none")


def _harness_metrics(episode: Record) -> list[tuple[str, str]]:
    """The harness's logged metrics and the numeric fields of its metadata, as (name, value) text."""
    metadata = episode.get("metadata", {})
    shown = [(str(name), f"{value:g}" if isinstance(value, float) else str(value))
             for name, value in metadata.get("harness_metrics", ())]
    shown += [(name, str(value)) for name, value in metadata.items()
              if isinstance(value, (int, float, bool)) and name != "harness_metrics"]
    return shown


def _completion(call: Record, trainer_version: int | None) -> str:
    """The completion's segments, each coloured by its version; a mark where a resume changed the version."""
    segments = call.get("segments") or [{"version": (call.get("versions") or [None])[0], "text": call["completion"]}]
    pieces = []
    for index, segment in enumerate(segments):
        version = segment["version"]
        gap = trainer_version - version if trainer_version is not None and version is not None else -1
        if index:
            pieces.append(f"<span class='resume' title='resumed under weight version {version}'>⟳ v{version}</span>")
        pieces.append(f"<span class='tokens' data-version='{version}' style='background:{gap_colour(gap)}' "
                      f"title='weight version {version}, staleness {gap}'>{html.escape(segment['text'])}</span>")
    return "".join(pieces)


def _call(index: int, call: Record, trainer_version: int | None) -> str:
    prompt = call["prompt"]
    cut = len(prompt) - PROMPT_CHARS
    shown = (f"… {cut} earlier characters …\n" + prompt[-PROMPT_CHARS:]) if cut > 0 else prompt
    versions = call.get("versions") or []
    span = "" if not versions else f"v{versions[0]}" + (f"–v{versions[1]}" if versions[1] != versions[0] else "")
    return (f"<div class='call'><div class='meta'>call {index + 1}: {call['prompt_tokens']} prompt tokens, "
            f"{call['completion_tokens']} completion tokens, finish {html.escape(str(call['finish_reason']))}, "
            f"weights {span}, staleness {call.get('staleness')}"
            f"{', resumed ' + str(call['resumed']) + '×' if call.get('resumed') else ''}</div>"
            f"<details><summary>prompt</summary><div class='prompt'>{html.escape(shown)}</div></details>"
            f"<div class='completion'>{_completion(call, trainer_version)}</div></div>")


def _episode(episode: Record) -> str:
    trainer_version = episode.get("trainer_version")
    staleness, failure = _staleness(episode), _failure(episode)
    metrics = ", ".join(f"{html.escape(name)} {html.escape(value)}" for name, value in _harness_metrics(episode))
    return (f"<div class='episode' data-reward='{float(episode['reward'])}' data-failure='{html.escape(failure)}' "
            f"data-staleness='{staleness}'><h3>row {html.escape(str(episode['row_id']))} · episode "
            f"{episode['episode']} · reward {float(episode['reward']):g}"
            f"{'' if failure == 'none' else ' · failed: ' + html.escape(failure)}</h3>"
            f"<div class='meta'>{len(episode['calls'])} call{'' if len(episode['calls']) == 1 else 's'}; "
            f"staleness up to {staleness}"
            f"{'; ' + metrics if metrics else ''}</div>"
            + "".join(_call(i, call, trainer_version) for i, call in enumerate(episode["calls"])) + "</div>")


def _options(values: Iterable[str]) -> str:
    return "<option value='any'>any</option>" + "".join(
        f"<option value='{html.escape(v)}'>{html.escape(v)}</option>" for v in sorted(set(values)))


def step_page(step: int, episodes: Sequence[Record]) -> str:
    """One sampled step's episodes, with the filters and the versions' legend."""
    trainer_version = next((e.get("trainer_version") for e in episodes if e.get("trainer_version") is not None), None)
    versions = sorted({segment["version"] for e in episodes for call in e["calls"]
                       for segment in call.get("segments", ())}, reverse=True)
    gaps = {v: trainer_version - v if trainer_version is not None else -1 for v in versions}
    legend = "".join(f"<span style='background:{gap_colour(gaps[v])}'>v{v}"
                     f"{'' if trainer_version is None else f' (staleness {gaps[v]})'}</span>" for v in versions)
    return (f"<!doctype html><meta charset='utf-8'><title>step {step} rollouts</title><style>{STYLE}</style>"
            f"<p><a href='index.html'>all sampled steps</a></p><h1>Step {step}: {len(episodes)} episodes</h1>"
            f"<p class='legend'>Tokens by the weight version that sampled them (trainer at v{trainer_version}): "
            f"{legend}</p>"
            "<div id='filters'>reward ≥ <input id='min-reward' type='number' step='any' size='5'> "
            f"failure <select id='failure'>{_options(_failure(e) for e in episodes)}</select> "
            f"staleness <select id='staleness'>{_options(str(_staleness(e)) for e in episodes)}</select> "
            f"— <span id='shown'>{len(episodes)}</span> shown</div>"
            + "".join(_episode(e) for e in episodes) + f"<script>{FILTER_SCRIPT}</script>\n")


def write_rollout_pages(output_dir: Path, report_dir: Path) -> Path | None:
    """The pages of `output_dir/rollouts` under `report_dir/rollouts`; the index's path, or None when nothing
    was sampled yet."""
    steps = read_sampled_steps(output_dir / "rollouts")
    if not steps:
        return None
    pages = report_dir / "rollouts"
    pages.mkdir(parents=True, exist_ok=True)
    rows = []
    for step, episodes in steps.items():
        (pages / f"step_{step}.html").write_text(step_page(step, episodes))
        rewards = [float(e["reward"]) for e in episodes]
        failed = sum(_failure(e) != "none" for e in episodes)
        gaps = [g for g in map(_staleness, episodes) if g is not None]
        rows.append(f"<tr><td><a href='step_{step}.html'>{step}</a></td><td>{len(episodes)}</td>"
                    f"<td>{sum(rewards) / max(1, len(rewards)):.3f}</td><td>{failed}</td>"
                    f"<td>{max(gaps) if gaps else '–'}</td></tr>")
    index = pages / "index.html"
    index.write_text("<!doctype html><meta charset='utf-8'><title>sampled rollouts</title>"
                     f"<style>{STYLE}</style><p><a href='../index.html'>the run's curves</a></p>"
                     f"<h1>Sampled rollouts: {len(steps)} steps</h1><table><tr><th>step</th><th>episodes</th>"
                     "<th>mean reward</th><th>failed (trained)</th><th>max staleness</th></tr>"
                     + "".join(rows) + "</table>\n")
    return index
