"""reasoning-gym's procedural tasks as a built-in task: `data.task=reasoning_gym:<spec>`.

Owns: reading the spec (one generator, a weighted mixture, or reasoning-gym's own composite YAML), the training and
held-out rows (generated offline from fixed seeds; a held-out question is never one of the training questions), the
prompt (one of reasoning-gym's system prompts, by default `default`: think, then the answer in `<answer>` tags) and
the reward (the generator's own `score_answer` on the extracted answer). Each row names its generator in `task`,
which splits the step's rewards and the held-out score by task. reasoning-gym is optional (`make
setup-environments`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Protocol

from fullasync.tasks.chat import reply_text

PREFIX = "reasoning_gym:"
TRAIN_SEED = 0  # the training rows' seed (a composite YAML's `seed` replaces it)
VAL_OFFSET = 7919  # the held-out rows' seed is the training seed plus this: another stream of the same generators
MISSING = "reasoning-gym is not installed: run `make setup-environments` (requirements/environments-lock.txt)"


Entry = dict[str, object]  # a generator's item (question, answer, the metadata its scorer reads), as made


class Dataset(Protocol):
    """What this task uses of a reasoning-gym dataset (a `CompositeDataset` here)."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Entry: ...

    def score_answer(self, answer: str | None, entry: Entry) -> float: ...


@dataclass(frozen=True)
class Generator:
    """One generator of a task: its reasoning-gym name, its share of the rows and its own settings."""

    name: str
    weight: float = 1.0
    config: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Spec:
    generators: tuple[Generator, ...]
    size: int | None = None  # training rows, when a YAML names them
    seed: int = TRAIN_SEED


def _library() -> ModuleType:
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(MISSING) from error
    return reasoning_gym


def _checked(generators: list[Generator]) -> tuple[Generator, ...]:
    known = sorted(_library().factory.DATASETS)
    names = [g.name for g in generators]
    for generator in generators:
        if generator.name not in known:
            near = difflib.get_close_matches(generator.name, known, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else f"; known: {', '.join(known)}"
            raise ValueError(f"data.task: reasoning-gym has no generator {generator.name!r}{hint}")
        if not generator.weight > 0:
            raise ValueError(f"data.task: {generator.name}'s weight {generator.weight} must be > 0")
    if len(set(names)) != len(names):
        raise ValueError(f"data.task: a generator is named twice in {'+'.join(names)}")
    return tuple(generators)


def _from_yaml(path: Path) -> Spec:
    import yaml

    data = yaml.safe_load(path.read_text())
    datasets = data.get("datasets") if isinstance(data, dict) else None
    if not isinstance(datasets, list) or not datasets:
        raise ValueError(f"data.task: {path} is not a reasoning-gym composite config: it needs `datasets:`, a list of "
                         "{name, weight, config}")
    generators = []
    for item in datasets:
        if not isinstance(item, dict) or "name" not in item:
            raise ValueError(f"data.task: {path}: each of `datasets` needs a `name`, got {item!r}")
        generators.append(Generator(str(item["name"]), float(item.get("weight", 1.0)), dict(item.get("config") or {})))
    size = data.get("size")
    return Spec(_checked(generators), int(size) if size is not None else None,
                int(data.get("seed") if data.get("seed") is not None else TRAIN_SEED))


def parse_spec(text: str) -> Spec:
    """`name`, `name*weight+name*weight` (a mixture; a weight defaults to 1) or the path of reasoning-gym's
    composite YAML (`datasets: [{name, weight, config}]`, optional `size` and `seed`)."""
    text = text.strip()
    if text.endswith((".yaml", ".yml")):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"data.task: no composite config at {path}")
        return _from_yaml(path)
    generators = []
    for part in text.split("+"):
        name, _, weight = part.strip().partition("*")
        if not name:
            raise ValueError(f"data.task=reasoning_gym:{text}: name a generator (reasoning_gym:chain_sum) or a "
                             "mixture (reasoning_gym:chain_sum*2+leg_counting)")
        try:
            generators.append(Generator(name.strip(), float(weight) if weight else 1.0))
        except ValueError:
            raise ValueError(f"data.task: {name}'s weight {weight!r} is not a number") from None
    return Spec(_checked(generators))


class ReasoningGymTask:
    """A spec's rows and its rollout function. Rows: `{"id", "task", "question", "answer"}`; the generator's entry
    behind each (what its scorer reads) stays here, so rows are plain JSON. Training rows are the generator's draws
    (a question may come twice); each held-out question comes once and is no training question."""

    def __init__(self, spec: Spec, train_rows: int, val_rows: int, model: str = "policy",
                 prompt: str = "default") -> None:
        """`prompt`: the name of one of reasoning-gym's system prompts (`SYSTEM_PROMPTS`), or the prompt's text."""
        if train_rows < 1 or val_rows < 0:
            raise ValueError(f"data.task_rows={train_rows} must be >= 1 and data.task_val_rows={val_rows} >= 0")
        self.spec = spec
        self.model = model
        self.system_prompt: str = _library().utils.SYSTEM_PROMPTS.get(prompt, prompt)
        if not self.system_prompt.strip():
            raise ValueError("data.task_prompt is empty: name one of reasoning-gym's system prompts "
                             f"({', '.join(_library().utils.SYSTEM_PROMPTS)}) or give its text")
        train_size = spec.size or train_rows
        self.train = self._dataset(train_size, spec.seed)  # its scorers score every row (dispatched by generator)
        self.entries: dict[str, Entry] = {}
        self._rows = {"train": self._collect("train", self.train, train_size, set()),
                      "val": []}
        if val_rows:
            seen = {row["question"] for row in self._rows["train"]}
            candidates = self._dataset(4 * val_rows, spec.seed + VAL_OFFSET)
            self._rows["val"] = self._collect("val", candidates, val_rows, seen)

    def _dataset(self, size: int, seed: int) -> Dataset:
        library = _library()
        specs = [library.composite.DatasetSpec(g.name, g.weight, dict(g.config)) for g in self.spec.generators]
        return library.composite.CompositeDataset(library.composite.CompositeConfig(size=size, seed=seed,
                                                                                     datasets=specs))

    def _collect(self, split: str, dataset: Dataset, wanted: int, excluded: set[str]) -> list[dict[str, str]]:
        rows: list[dict[str, str]] = []
        for index in range(len(dataset)):
            if len(rows) == wanted:
                break
            entry = dataset[index]
            if entry["question"] in excluded:
                continue
            if split == "val":  # each held-out question once: its standard error counts each row as one
                excluded.add(str(entry["question"]))
            metadata = entry["metadata"]
            source = metadata.get("source_dataset") if isinstance(metadata, dict) else None
            row = {"id": f"{split}-{index}", "task": str(source), "question": str(entry["question"]),
                   "answer": str(entry["answer"])}
            self.entries[row["id"]] = entry
            rows.append(row)
        if len(rows) < wanted:
            raise ValueError(f"data.task: the generators made only {len(rows)} distinct held-out questions that are "
                             f"not training questions, of {wanted} asked; lower data.task_val_rows or data.task_rows")
        return rows

    def rows(self, split: str) -> list[dict[str, str]]:
        if split not in self._rows:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        return list(self._rows[split])

    def score(self, text: str | None, row: Mapping[str, object]) -> float:
        """The generator's own score (0..1) of the reply's last `<answer>` (none: the scorer sees None)."""
        entry = self.entries.get(str(row.get("id")))
        if entry is None:
            raise KeyError(f"row {row.get('id')!r} is not one of this task's rows")
        answer = _library().utils.extract_answer(text or "")
        return float(self.train.score_answer(answer, entry))

    async def rollout_fn(self, client: object, row: Mapping[str, object]) -> float:
        """One episode: the question under reasoning-gym's system prompt; the reply runs to its end or the
        context's; the generator scores the answer."""
        messages = [{"role": "system", "content": self.system_prompt},
                    {"role": "user", "content": str(row["question"])}]
        return self.score(await reply_text(client, self.model, messages), row)
