"""Tests for eval.datasets and eval.popqa: every layout on small files, error cases, then the real data."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from bertknn_search.errors import ConfigError, InputFormatError
from bertknn_search.eval import popqa
from bertknn_search.eval.datasets import (
    Fact,
    lama_relations,
    read_common_vocab,
    read_facts,
    read_lama,
    read_lama_uhn,
    read_popqa,
    read_questions_jsonl,
)
from bertknn_search.eval.relations import parse_relations


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def trex_line(uuid: str, sub: str, obj: str, pred: str) -> dict:
    evidence = {"sub_surface": sub, "obj_surface": obj, "masked_sentence": f"{sub} lives in [MASK]."}
    return {"uuid": uuid, "obj_label": obj, "sub_label": sub, "predicate_id": pred, "evidences": [evidence]}


def google_line(uuid: str, sub: str, obj: str, judgments: list[str]) -> dict:
    return {
        "pred": "/people/person/place_of_birth",
        "sub_label": sub,
        "obj_label": obj,
        "uuid": uuid,
        "judgments": [{"rater": str(i), "judgment": j} for i, j in enumerate(judgments)],
        "masked_sentences": [f"{sub} was raised in [MASK]."],
    }


@pytest.fixture
def lama_root(tmp_path: Path) -> Path:
    """All four LAMA corpora in data.zip's layout, two or three facts each."""
    root = tmp_path / "lama"
    write_jsonl(
        root / "relations.jsonl",
        [
            {"relation": "P19", "template": "[X] was born in [Y] .", "label": "place of birth"},
            {"relation": "P101", "template": "[X] works in the field of [Y] .", "label": "field of work"},
        ],
    )
    write_jsonl(root / "TREx" / "P101.jsonl", [trex_line("t3", "Ada Lovelace", "mathematics", "P101")])
    write_jsonl(
        root / "TREx" / "P19.jsonl",
        [trex_line("t1", "Allan Peiper", "Alexandra", "P19"), trex_line("t2", "Zorblat", "Quenton", "P19")],
    )
    (root / "TREx" / "README.md").write_text("not a relation file", encoding="utf-8")
    write_jsonl(
        root / "Google_RE" / "place_of_birth_test.jsonl",
        [
            google_line("g1", "Khatchig Mouradian", "Lebanon", ["yes", "yes", "no"]),
            google_line("g2", "Jacob Lindgren", "Oslo", ["no", "no", "yes"]),  # raters said no: LAMA drops it
        ],
    )
    write_jsonl(root / "Google_RE" / "date_of_birth_test.jsonl", [google_line("g3", "Ada", "1815", ["yes"])])
    write_jsonl(
        root / "ConceptNet" / "test.jsonl",
        [
            {
                "pred": "HasPrerequisite",
                "masked_sentences": ["Contemplating requires [MASK].", "Another sentence [MASK]."],
                "obj_label": "concentration",
                "uuid": "c1",
                "sub_label": "contemplating",
            }
        ],
    )
    write_jsonl(
        root / "Squad" / "test.jsonl",
        [
            {
                "masked_sentences": ["Von Miller plays in [MASK] position."],
                "obj_label": "linebacker",
                "id": "s1",
            },
            {
                "masked_sentences": ["In [MASK] schools the language is [MASK]."],
                "obj_label": "Chinese",
                "id": "s2",
            },
        ],
    )
    return root


EXPECTED_LAMA = [
    Fact("Google-RE", "date_of_birth", "Ada (born [MASK]).", ("1815",), "Ada", "g3"),
    Fact(
        "Google-RE",
        "place_of_birth",
        "Khatchig Mouradian was born in [MASK] .",
        ("Lebanon",),
        "Khatchig Mouradian",
        "g1",
    ),
    Fact("T-REx", "P19", "Allan Peiper was born in [MASK] .", ("Alexandra",), "Allan Peiper", "t1"),
    Fact("T-REx", "P19", "Zorblat was born in [MASK] .", ("Quenton",), "Zorblat", "t2"),
    Fact(
        "T-REx", "P101", "Ada Lovelace works in the field of [MASK] .", ("mathematics",), "Ada Lovelace", "t3"
    ),
    Fact("ConceptNet", "ConceptNet", "Contemplating requires [MASK].", ("concentration",), None, "c1"),
    Fact("SQuAD", "SQuAD", "Von Miller plays in [MASK] position.", ("linebacker",), None, "s1"),
    # Two masks, as in 3 of LAMA's SQuAD lines: kept so that counts match; the harness skips it.
    Fact("SQuAD", "SQuAD", "In [MASK] schools the language is [MASK].", ("Chinese",), None, "s2"),
]


def test_read_lama_reads_every_corpus(lama_root: Path):
    assert read_lama(lama_root) == EXPECTED_LAMA
    assert EXPECTED_LAMA[2].key == "T-REx/P19/t1"


def test_read_lama_google_re_judgment_filter_can_be_turned_off(lama_root: Path):
    facts = read_lama(lama_root, ["Google-RE"], google_re_judgments=False)
    assert [f.uuid for f in facts] == ["g3", "g1", "g2"]


def test_read_lama_subset_and_missing_folders(lama_root: Path):
    assert read_lama(lama_root, ["SQuAD", "T-REx"]) == EXPECTED_LAMA[2:5] + EXPECTED_LAMA[6:]
    shutil.rmtree(lama_root / "TREx")
    shutil.rmtree(lama_root / "Google_RE")
    assert read_lama(lama_root) == EXPECTED_LAMA[5:]


def test_read_lama_errors(lama_root: Path, tmp_path: Path):
    with pytest.raises(InputFormatError, match=r"^no LAMA data under .*empty: expected Google_RE/, TREx/"):
        read_lama(tmp_path / "empty")
    with pytest.raises(ConfigError, match=r"unknown LAMA corpora \['Wiki'\]"):
        read_lama(lama_root, ["Wiki"])
    write_jsonl(lama_root / "TREx" / "P20.jsonl", [trex_line("t9", "X", "Y", "P20")])
    with pytest.raises(
        InputFormatError, match=r"P20.jsonl: relation P20 has no template in .*relations.jsonl$"
    ):
        read_lama(lama_root)
    (lama_root / "relations.jsonl").unlink()
    with pytest.raises(
        InputFormatError, match=r"relations.jsonl is missing: T-REx questions need its templates"
    ):
        read_lama(lama_root, ["T-REx"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b'{"uuid": "t1", "sub_label": "A", "obj_label": "B"}\n{"uuid": ',
            r"P19.jsonl:2: not a UTF-8 JSON line",
        ),
        (b'["a list"]\n', r"P19.jsonl:1: expected a JSON object, got list"),
        (b'{"uuid": "t1", "sub_label": "\xff"}\n', r"P19.jsonl:1: not a UTF-8 JSON line"),
        (
            b'{"uuid": "t1", "obj_label": "B"}\n',
            r"P19.jsonl:1: field 'sub_label' is missing or not a non-empty string",
        ),
    ],
)
def test_read_lama_bad_lines_name_file_and_line(lama_root: Path, content: bytes, message: str):
    (lama_root / "TREx" / "P19.jsonl").write_bytes(content)
    with pytest.raises(InputFormatError, match=message) as info:
        read_lama(lama_root)
    assert "\n" not in str(info.value)


def test_read_lama_sentence_corpora_need_masked_sentences(lama_root: Path):
    write_jsonl(lama_root / "Squad" / "test.jsonl", [{"masked_sentences": [], "obj_label": "x", "id": "1"}])
    with pytest.raises(
        InputFormatError, match=r"test.jsonl:1: field 'masked_sentences' must be a non-empty list"
    ):
        read_lama(lama_root, ["SQuAD"])
    write_jsonl(
        lama_root / "Squad" / "test.jsonl", [{"masked_sentences": ["no mask"], "obj_label": "x", "id": "1"}]
    )
    with pytest.raises(InputFormatError, match=r"test.jsonl:1: masked sentence has no \[MASK\]"):
        read_lama(lama_root, ["SQuAD"])


def test_read_lama_uhn(lama_root: Path, tmp_path: Path):
    uhn = tmp_path / "lama-uhn"
    write_jsonl(uhn / "TREx_UHN" / "P19.jsonl", [trex_line("t2", "Zorblat", "Quenton", "P19")])
    expected = [Fact("LAMA-UHN", "P19", "Zorblat was born in [MASK] .", ("Quenton",), "Zorblat", "t2")]
    assert read_lama_uhn(uhn, lama_root / "relations.jsonl") == expected
    assert read_lama_uhn(uhn / "TREx_UHN", lama_root / "relations.jsonl") == expected
    with pytest.raises(InputFormatError, match=r"^no LAMA-UHN data under .*: expected TREx_UHN/P\*.jsonl$"):
        read_lama_uhn(tmp_path / "nothing", lama_root / "relations.jsonl")


def test_relations_select_by_id_across_corpora(lama_root: Path, tmp_path: Path):
    assert lama_relations(lama_root) == [
        "date_of_birth",
        "place_of_birth",
        "P19",
        "P101",
        "ConceptNet",
        "SQuAD",
    ]
    picked = read_facts(lama=lama_root, relations=["P19", "place_of_birth", "squad"])
    assert picked == [f for f in EXPECTED_LAMA if f.relation in ("P19", "place_of_birth", "SQuAD")]
    # Ids are matched without regard to case, and a relation file not asked for is never opened.
    (lama_root / "TREx" / "P101.jsonl").write_bytes(b"\xff not json\n")
    assert read_facts(lama=lama_root, relations=["p19"]) == [f for f in EXPECTED_LAMA if f.relation == "P19"]
    uhn = tmp_path / "uhn"
    write_jsonl(uhn / "TREx_UHN" / "P19.jsonl", [trex_line("t2", "Zorblat", "Quenton", "P19")])
    write_jsonl(uhn / "TREx_UHN" / "P101.jsonl", [trex_line("t3", "Ada Lovelace", "mathematics", "P101")])
    both = read_facts(lama=lama_root, lama_uhn=uhn, relations=["P19"])
    assert [(f.corpus, f.uuid) for f in both] == [("T-REx", "t1"), ("T-REx", "t2"), ("LAMA-UHN", "t2")]
    only_uhn = read_facts(lama_uhn=uhn, relations_file=lama_root / "relations.jsonl", relations=["P101"])
    assert [(f.corpus, f.uuid) for f in only_uhn] == [("LAMA-UHN", "t3")]


def test_relations_filter_questions_and_popqa_by_their_relation(tmp_path: Path):
    path = write_jsonl(
        tmp_path / "q.jsonl",
        [
            {"question": "A was born in [MASK].", "answers": ["x"], "relation": "born"},
            {"question": "A worked as a [MASK].", "answers": ["y"], "relation": "job"},
        ],
    )
    assert [f.relation for f in read_facts(questions=path, relations=["job"])] == ["job"]


def test_unknown_relations_are_one_line_listing_the_known_ones(lama_root: Path):
    with pytest.raises(ConfigError) as err:
        read_facts(lama=lama_root, corpora=["T-REx"], relations=["P19", "P999", "P1000"])
    assert str(err.value) == "unknown relations P999, P1000; the data named holds: P19, P101"
    # The old meaning of --relations (the templates file) is pointed to its new name.
    with pytest.raises(
        ConfigError, match=r"^unknown relation .*relations.jsonl; .*goes to --relations-file\)$"
    ):
        read_facts(lama=lama_root, relations=[str(lama_root / "relations.jsonl")])
    with pytest.raises(ConfigError, match="names no relation"):
        parse_relations(" , ")
    assert parse_relations("P19, P103,P19") == ["P19", "P103"]
    assert parse_relations(None) is None


def test_read_common_vocab(tmp_path: Path):
    path = tmp_path / "vocab.txt"
    path.write_text("paris\n\nrome \nparis\n", encoding="utf-8")
    assert read_common_vocab(path) == {"paris", "rome"}
    with pytest.raises(InputFormatError, match=r"^cannot read common vocabulary .*missing.txt"):
        read_common_vocab(tmp_path / "missing.txt")


def test_read_questions_jsonl(tmp_path: Path):
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {
                "question": "Zorblat was born in [MASK] .",
                "answers": ["Quenton", "quenton"],
                "subject": "Zorblat",
            },
            {
                "question": "The capital of France is [MASK] .",
                "answers": "Paris",
                "relation": "capital",
                "id": 7,
            },
        ],
    )
    assert read_questions_jsonl(path) == [
        Fact("mine", "mine", "Zorblat was born in [MASK] .", ("Quenton", "quenton"), "Zorblat", "1"),
        Fact("mine", "capital", "The capital of France is [MASK] .", ("Paris",), None, "7"),
    ]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            {"question": "No mask here.", "answers": ["x"]},
            r"mine.jsonl:1: the question must contain exactly one \[MASK\]",
        ),
        ({"question": "[MASK] and [MASK]", "answers": ["x"]}, r"exactly one \[MASK\]"),
        (
            {"question": "A [MASK].", "answers": []},
            r"mine.jsonl:1: field 'answers' must be a non-empty list of strings",
        ),
        ({"question": "A [MASK].", "answers": [3]}, r"field 'answers' must be a non-empty list of strings"),
        ({"question": "A [MASK].", "answers": ["x"], "subject": 5}, r"field 'subject' must be a string"),
        ({"answers": ["x"]}, r"field 'question' is missing"),
    ],
)
def test_read_questions_jsonl_errors(tmp_path: Path, row: dict, message: str):
    with pytest.raises(InputFormatError, match=message):
        read_questions_jsonl(write_jsonl(tmp_path / "mine.jsonl", [row]))


TSV_HEADER = (
    "id\tsubj\tprop\tobj\tsubj_id\tprop_id\tobj_id\ts_aliases\to_aliases\ts_uri\to_uri\ts_wiki_title\t"
    "o_wiki_title\ts_pop\to_pop\tquestion\tpossible_answers"
)


def tsv_row(id_: int, subj: str, prop: str, obj: str, pop: int, question: str, answers: list[str]) -> str:
    cells = [str(id_), subj, prop, obj, "1", "2", "3", "[]", "[]", "u", "v", subj, obj, str(pop), "9"]
    return "\t".join([*cells, question, json.dumps(answers)])


def test_read_popqa_tsv(tmp_path: Path):
    path = tmp_path / "popQA.tsv"
    rows = [
        tsv_row(4222362, "George Rankin", "occupation", "politician", 142,
                "What is George Rankin's occupation?", ["politician", "political leader"]),
        tsv_row(1, "Var", "capital of", "Toulon", 3724, "What is Var the capital of?", ["France"]),
    ]  # fmt: skip
    path.write_text("\n".join([TSV_HEADER, *rows]) + "\n", encoding="utf-8")
    assert read_popqa(path) == [
        Fact(
            "PopQA", "occupation", "George Rankin's occupation is [MASK] .",
            ("politician", "political leader"), "George Rankin", "4222362", 142.0,
        ),
        Fact("PopQA", "capital of", "Var is the capital of [MASK] .", ("France",), "Var", "1", 3724.0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["id\tsubj\tprop"], r"popQA.tsv:1: PopQA TSV lacks columns \['possible_answers', 's_pop'\]"),
        (
            [TSV_HEADER, tsv_row(1, "A", "weight", "b", 3, "q", ["b"])],
            r"popQA.tsv:2: unknown PopQA relation 'weight'",
        ),
        (
            [TSV_HEADER, tsv_row(1, "A", "genre", "b", 3, "q", ["b"]).replace('["b"]', "b")],
            r"popQA.tsv:2: possible",
        ),
        (
            [TSV_HEADER, tsv_row(1, "A", "genre", "b", -3, "q", ["b"])],
            r"popQA.tsv:2: s_pop '-3' must be a finite",
        ),
    ],
)
def test_read_popqa_tsv_errors(tmp_path: Path, lines: list[str], message: str):
    path = tmp_path / "popQA.tsv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputFormatError, match=message):
        read_popqa(path)


def derived_item(question: str, answers: list[str], id_: int = 1, pop: int = 41) -> dict:
    return {"input": question, "output": json.dumps(answers), "id": id_, "s_pop": pop, "o_pop": 5}


def test_read_popqa_derived_json(tmp_path: Path):
    path = tmp_path / "popqa.json"
    data = {
        "name": "popqa",
        "dev": [
            derived_item("What sport does José Silva play?", ["association football", "soccer"], 1412286)
        ],
        "test": [derived_item("What is the capital of Var?", ["Toulon"], 375943, 3724)],
    }
    path.write_text(json.dumps(data), encoding="utf-8")
    assert read_popqa(path, "dev") == [
        Fact("PopQA", "sport", "José Silva plays [MASK] .", ("association football", "soccer"), "José Silva",
             "1412286", 41.0),
    ]  # fmt: skip
    assert read_popqa(path) == [
        Fact("PopQA", "capital", "The capital of Var is [MASK] .", ("Toulon",), "Var", "375943", 3724.0)
    ]
    with pytest.raises(InputFormatError, match=r"popqa.json: no list 'train'"):
        read_popqa(path, "train")
    data["test"] = [derived_item("How tall is Var?", ["tall"])]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(InputFormatError, match=r"popqa.json:test\[0\]: 'How tall is Var\?' matches no PopQA"):
        read_popqa(path)


@pytest.mark.parametrize(
    ("question", "prop"),
    [
        ("What is Ann's occupation?", "occupation"),
        ("In what city was Ann born?", "place of birth"),
        ("What genre is Ann?", "genre"),
        ("Who is the father of Ann?", "father"),
        ("In what country is Ann?", "country"),
        ("Who was the producer of Ann?", "producer"),
        ("Who was the director of Ann?", "director"),
        ("What is Ann the capital of?", "capital of"),
        ("Who was the screenwriter for Ann?", "screenwriter"),
        ("Who was the composer of Ann?", "composer"),
        ("What color is Ann?", "color"),
        ("What is the religion of Ann?", "religion"),
        ("What sport does Ann play?", "sport"),
        ("Who is the author of Ann?", "author"),
        ("Who is the mother of Ann?", "mother"),
        ("What is the capital of Ann?", "capital"),
    ],
)
def test_popqa_question_templates(question: str, prop: str):
    assert popqa.parse_question(question) == (prop, "Ann")
    assert popqa.TEMPLATES[prop].count("[X]") == popqa.TEMPLATES[prop].count("[Y]") == 1


def test_popqa_templates_cover_the_sixteen_relations():
    assert list(popqa.TEMPLATES) == list(popqa.QUESTIONS)
    assert len(popqa.TEMPLATES) == 16


# -- the real files (counts checked with `wc -l` and a standalone script before being written here) ----------


def count_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


def test_real_lama(shared_data: Path):
    lama = shared_data / "lama"
    facts = read_lama(lama)
    by_relation = Counter((f.corpus, f.relation) for f in facts)
    files = sorted((lama / "TREx").glob("P*.jsonl"))
    assert len(files) == 28
    assert {rel: n for (corpus, rel), n in by_relation.items() if corpus == "T-REx"} == {
        p.stem: count_lines(p) for p in files
    }
    assert by_relation[("T-REx", "P19")] == 944
    assert sum(n for (corpus, _), n in by_relation.items() if corpus == "T-REx") == 22881
    assert by_relation[("SQuAD", "SQuAD")] == 305
    assert sum(f.question.count("[MASK]") != 1 for f in facts) == 3  # SQuAD's two-mask sentences
    assert facts[0] == Fact(
        "T-REx", "P19", "Allan Peiper was born in [MASK] .", ("Alexandra",), "Allan Peiper",
        "6a9d91c1-eb9b-4142-8371-3c063ec40700",
    )  # fmt: skip
    assert len({f.key for f in facts}) == len(facts)


def test_real_lama_uhn(shared_data: Path):
    facts = read_lama_uhn(shared_data / "lama-uhn", shared_data / "lama" / "relations.jsonl")
    counts = Counter(f.relation for f in facts)
    assert len(counts) == 31
    assert counts["P19"] == 728
    assert sum(counts.values()) == 19362


def test_real_conceptnet_subset_in_lama_layout(shared_data: Path, tmp_path: Path):
    source = shared_data / "lama" / "partial" / "conceptnet_misprimed_subset" / "ConceptNet.jsonl"
    (tmp_path / "ConceptNet").mkdir()
    shutil.copy(source, tmp_path / "ConceptNet" / "test.jsonl")
    facts = read_lama(tmp_path)
    assert len(facts) == count_lines(source) == 146
    assert facts[0] == Fact(
        "ConceptNet", "ConceptNet", "Contemplating requires [MASK].", ("concentration",), None,
        "9a22d9f0ceac604a0d24be3563e00ed0",
    )  # fmt: skip


def test_real_popqa_derived(shared_data: Path):
    path = shared_data / "popqa" / "partial" / "model_collaboration_popqa_2000.json"
    dev, test = read_popqa(path, "dev"), read_popqa(path, "test")
    assert (len(dev), len(test)) == (1000, 1000)
    assert Counter(f.relation for f in dev + test) == {
        "screenwriter": 290, "director": 251, "producer": 238, "genre": 212, "author": 202, "country": 121,
        "composer": 120, "capital": 95, "place of birth": 94, "occupation": 93, "father": 91, "sport": 70,
        "capital of": 47, "religion": 46, "mother": 23, "color": 7,
    }  # fmt: skip
    assert test[0] == Fact(
        "PopQA", "capital", "The capital of Var is [MASK] .", ("Toulon", "Port-la-Montagne", "Tolon"), "Var",
        "375943", 3724.0,
    )  # fmt: skip


def test_real_common_vocab(shared_data: Path):
    assert len(read_common_vocab(shared_data / "lama" / "common_vocab_lowercased.txt")) == 16842
    assert len(read_common_vocab(shared_data / "lama" / "common_vocab_cased.txt")) == 21018
