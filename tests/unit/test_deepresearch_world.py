"""examples/deepresearch: the generated world is deterministic, split by entity, loads through
`datasets`, and BM25 (SQLite FTS5) finds the gold documents."""

from __future__ import annotations

import json

from examples.deepresearch.data import load_corpus, load_questions, normalize_question
from examples.deepresearch.retrieval import Bm25Index, match_expression
from examples.deepresearch.world import WorldSpec, documents, ensure_world, generate_world, questions, write_world


def test_generation_is_deterministic_and_the_seed_matters(tmp_path):
    write_world(WorldSpec(), tmp_path / "a")
    write_world(WorldSpec(), tmp_path / "b")
    for name in ("corpus.jsonl", "train.jsonl", "heldout.jsonl"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    other = generate_world(WorldSpec(seed=1))
    assert documents(other) != documents(generate_world(WorldSpec()))


def test_world_size_and_question_kinds():
    world = generate_world(WorldSpec())
    docs, rows = documents(world), questions(world)
    assert 2000 <= len(docs) <= 5000 and len({d.doc_id for d in docs}) == len(docs)
    assert {row["hops"] for row in rows} == {1, 2, 3}
    assert all(len(row["search_queries"]) == row["hops"] == len(row["gold_doc_ids"]) for row in rows)


def test_held_out_questions_share_no_person_or_organisation_with_training():
    rows = questions(generate_world(WorldSpec()))
    def entities(split):
        return {d for row in rows if row["split"] == split for d in row["gold_doc_ids"] if d[0] in "po"}
    train, held_out = entities("train"), entities("heldout")
    assert held_out and train and not train & held_out
    assert 0.15 < sum(row["split"] == "heldout" for row in rows) / len(rows) < 0.25


def test_bm25_finds_the_gold_document_of_a_known_question():
    world = generate_world(WorldSpec())
    index = Bm25Index(documents(world))
    row = next(r for r in questions(world) if r["kind"] == "founder_birth_country")
    for query, gold in zip(row["search_queries"], row["gold_doc_ids"]):
        assert index.search_now(query, 3)[0].doc_id == gold, (query, gold)
    assert index.search_now(row["question"], 3)[0].doc_id == row["gold_doc_ids"][0]
    hits = index.search_now(row["question"], 5)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert index.open_now(row["gold_doc_ids"][-1]).text.endswith(f"{row['answer']}.")


def test_every_gold_document_is_the_top_hit_for_its_entity_name():
    world = generate_world(WorldSpec())
    index = Bm25Index(documents(world))
    misses = [(q, g) for row in questions(world) for q, g in zip(row["search_queries"], row["gold_doc_ids"])
              if index.search_now(q, 1)[0].doc_id != g]
    assert misses == []


def test_model_written_queries_never_break_the_fts5_syntax():
    index = Bm25Index(documents(generate_world(WorldSpec(people=50, organisations=20, events=10))))
    for query in ['"unbalanced', "AND OR NOT", "near(x y)", "*", "{}", "", "  "]:
        assert isinstance(index.search_now(query, 3), list)
    assert match_expression('Kaqui "taskaka" kaqui') == '"kaqui" OR "taskaka"'


def test_files_load_through_datasets_and_user_fields_are_mapped(tmp_path):
    directory = ensure_world(WorldSpec(), cache_dir=tmp_path)
    assert ensure_world(WorldSpec(), cache_dir=tmp_path) == directory
    rows = load_questions(directory / "heldout.jsonl", limit=5)
    assert len(rows) == 5 and all(isinstance(r["answers"], list) and r["answers"] for r in rows)
    corpus = load_corpus(directory / "corpus.jsonl")
    assert len(corpus) == len(documents(generate_world(WorldSpec())))
    browsecomp_style = tmp_path / "mine.jsonl"
    browsecomp_style.write_text(json.dumps({"query_id": "7", "query": "who?", "answer": "x y"}) + "\n")
    (row,) = load_questions(browsecomp_style)
    assert (row["id"], row["question"], row["answers"]) == ("7", "who?", ["x y"])
    assert normalize_question({"question": "q", "answers": ["a", "b"]}, 3)["id"] == "q3"
