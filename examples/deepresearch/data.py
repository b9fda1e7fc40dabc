"""Question and corpus files, read through Hugging Face `datasets` (JSONL on disk).

Owns: mapping the field names of common search-QA files onto the rows the agent reads, so a user's
own files (ASearcher- or BrowseComp-Plus-style) work without code changes:

    question: question | query | problem | prompt        → row["question"]
    answer:   answers | answer | gold_answer | ground_truth (a string or a list) → row["answers"] (list)
    id:       id | query_id | qid (else the line number)  → row["id"]

    corpus:   doc_id | docid | id, text | contents, title (optional)  → `Document`

Every other field is kept as is. Does not own: generating the built-in files (`world.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.deepresearch.world import Document

QUESTION_FIELDS = ("question", "query", "problem", "prompt")
ANSWER_FIELDS = ("answers", "answer", "gold_answer", "ground_truth")
ID_FIELDS = ("id", "query_id", "qid")
DOC_ID_FIELDS = ("doc_id", "docid", "id")
DOC_TEXT_FIELDS = ("text", "contents")


def _first(record: dict[str, Any], fields: tuple[str, ...], what: str, path: str) -> Any:
    for name in fields:
        if record.get(name) not in (None, ""):
            return record[name]
    raise ValueError(f"{path}: a record has no {what} field; expected one of {list(fields)}, got {sorted(record)}")


def _load_jsonl(path: str | Path) -> Any:
    import datasets

    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist; point the config at a JSONL file")
    datasets.disable_progress_bars()
    return datasets.load_dataset("json", data_files=str(path), split="train")


def normalize_question(record: dict[str, Any], index: int, path: str = "<row>") -> dict[str, Any]:
    """One row in the agent's shape: id, question, answers (list of strings), other fields kept."""
    answers = _first(record, ANSWER_FIELDS, "answer", path)
    answers = [str(a) for a in answers] if isinstance(answers, (list, tuple)) else [str(answers)]
    row_id = next((record[f] for f in ID_FIELDS if record.get(f) not in (None, "")), f"q{index}")
    return {**record, "id": str(row_id), "question": str(_first(record, QUESTION_FIELDS, "question", path)),
            "answers": answers}


def load_questions(path: str | Path, limit: int = 0) -> list[dict[str, Any]]:
    """Rows of a question file (the first `limit` when > 0)."""
    dataset = _load_jsonl(path)
    if limit > 0:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return [normalize_question(record, index, str(path)) for index, record in enumerate(dataset)]


def load_corpus(path: str | Path) -> list[Document]:
    """Documents of a corpus file."""
    documents = []
    for record in _load_jsonl(path):
        documents.append(Document(doc_id=str(_first(record, DOC_ID_FIELDS, "document id", str(path))),
                                  title=str(record.get("title") or ""),
                                  text=str(_first(record, DOC_TEXT_FIELDS, "document text", str(path)))))
    return documents
