"""What chance allows a calibration check: the ECE floor of a perfectly calibrated p, and the intervals."""

from __future__ import annotations

import numpy as np

from bertknn_search.eval.calibration import (
    MIN_LOW_KIND,
    Measured,
    calibrate,
    choose_bands,
    kind,
    kinds_left_out,
    left_out,
)
from bertknn_search.eval.reliability import auc, ece
from bertknn_search.eval.report import render_calibration
from bertknn_search.eval.sampling import CHUNK, auroc_interval, ece_draws, ece_floor, share_interval
from bertknn_search.query.answer_kinds import KindSignals
from bertknn_search.query.confidence import Signals


def test_the_floor_is_the_ece_of_outcomes_drawn_from_p_itself() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 150)
    floor = ece_floor(p)
    # a hand-made draw: outcomes from p, binned as ece bins them
    hand = [ece(p, np.random.default_rng(s).random(150) < p) for s in range(300)]
    assert abs(floor["median"] - float(np.median(hand))) < 0.01
    assert floor["median"] <= floor["p95"]
    assert floor["median"] > 0.03  # 150 answers: a calibrated p is far from ECE 0


def test_the_floor_falls_as_the_answers_grow_and_is_zero_for_certain_answers() -> None:
    rng = np.random.default_rng(1)
    small = ece_floor(rng.uniform(0, 1, 100))["median"]
    large = ece_floor(rng.uniform(0, 1, 10_000))["median"]
    assert large < small / 5  # about 1/sqrt(n)
    assert ece_floor([0.0] * 50 + [1.0] * 50)["p95"] == 0.0  # p 0 or 1: every draw is as p says
    assert ece_floor([])["median"] is None
    assert len(ece_draws([0.3] * 10, draws=7)) == 7


def test_the_floor_is_seeded_and_does_not_depend_on_the_chunk() -> None:
    p = np.linspace(0.01, 0.99, 120)
    assert ece_floor(p) == ece_floor(p)
    other = ece_draws(p, seed=7)
    assert not np.array_equal(ece_draws(p), other)  # another seed draws other outcomes ...
    assert abs(np.median(ece_draws(p)) - np.median(other)) < 0.01  # ... with the same floor
    # drawn in pieces of CHUNK, the draws are those of one (draws, answers) array of the same stream
    outcomes = np.random.default_rng(49).random((CHUNK + 5, len(p))) < p
    want = [ece(p, drawn) for drawn in outcomes]
    np.testing.assert_allclose(ece_draws(p, draws=CHUNK + 5, seed=49), want, atol=1e-12)


def test_auc_gives_ties_their_mean_rank() -> None:
    # pairs (right, wrong): 0.4 vs 0.1, 0.2: wins; 0.4 vs 0.4: half; 0.8 wins all; 3 right x 3 wrong
    scores = [0.1, 0.4, 0.4, 0.8, 0.2, 0.4]
    hits = [False, True, False, True, False, True]
    assert auc(scores, hits) == (2.5 + 3 + 2.5) / 9
    assert auc(scores, [False] * 6) is None


def test_the_auroc_interval_holds_the_auroc_and_needs_both_outcomes() -> None:
    rng = np.random.default_rng(2)
    p = rng.uniform(0, 1, 200)
    hits = rng.random(200) < p
    low, high = auroc_interval(p, hits)  # type: ignore[misc]
    assert low < (auc(p, hits) or 0) < high
    assert auroc_interval(p, np.ones(200, dtype=bool)) is None


def test_the_wilson_interval_of_a_share() -> None:
    assert share_interval(0, 2) == [0.0, 0.658]  # 0 of 2 says little: up to two in three
    low, high = share_interval(40, 100)  # type: ignore[misc]
    assert low < 0.4 < high and abs(low - 0.309) < 0.002 and abs(high - 0.498) < 0.002
    assert share_interval(0, 0) is None


def test_calibrate_gives_each_kind_left_out_its_floor_and_the_report_shows_it() -> None:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(480):
        relation = ("P19", "P20", "P103", "P1412", "P106", "P101")[i % 6]
        votes = int(rng.integers(0, 20))
        found = Signals(0.5, 0.1, votes, 20, votes / 20, votes > 10, 0.5, 1.0, 20, 1.0, KindSignals())
        rows.append(Measured(str(i), relation, found, bool(rng.random() < (votes + 1) / 22)))
    _, check = calibrate(rows)
    for name, part in check["kinds_left_out"].items():
        floor = part["chance"]["ece_floor"]
        assert 0 < floor["median"] <= floor["p95"] < 0.3, name
        assert part["chance"]["auroc_95"] is not None
    text = render_calibration(check, None)
    assert "ECE by chance" in text
    assert "checked on relations and kinds left out" in text
    assert f"in each kind with {MIN_LOW_KIND} answers or more under it" in text
    median = check["kinds_left_out"]["languages"]["chance"]["ece_floor"]["median"]
    assert f"{median:.3f}" in text


def test_the_bands_keep_their_promise_on_kinds_left_out_too() -> None:
    # Places and languages are right far more often than professions with the same votes: a fit that
    # never saw professions promises them too much, which relations left out (other professions seen)
    # hide. "High" must then rise until it holds on kinds left out as well.
    rng = np.random.default_rng(7)
    rate = {"P19": 0.9, "P20": 0.9, "P103": 0.9, "P1412": 0.9, "P106": 0.2, "P101": 0.2}
    rows = []
    for i in range(600):
        relation = list(rate)[i % 6]
        votes = int(rng.integers(0, 20))
        found = Signals(0.5, 0.1, votes, 20, votes / 20, votes > 10, 0.5, 1.0, 20, 1.0, KindSignals())
        rows.append(Measured(str(i), relation, found, bool(rng.random() < rate[relation] * votes / 20)))
    hits = np.array([r.hit for r in rows])
    eligible = np.array([r.signals.votes >= 2 for r in rows])
    by_relations = choose_bands(left_out(rows), hits, eligible)[0]
    p_kind, _ = kinds_left_out(rows)
    _, check = calibrate(rows)
    assert check["bands"]["checked_on"] == "relations and kinds left out"
    assert check["bands"]["high"] > by_relations  # relations left out alone would have cut lower
    broken = (p_kind >= by_relations) & eligible
    assert hits[broken].mean() < 0.5  # the cut of relations left out breaks the promise on kinds left out
    high = (p_kind >= check["bands"]["high"]) & eligible
    assert not high.any() or hits[high].mean() >= 0.5


def test_low_keeps_its_promise_in_every_kind_left_out_that_has_enough_answers_under_it() -> None:
    # 200 places answers far under the cut, all wrong, hide from the pooled check a kind whose answers
    # just under 0.05 are right 2 times in 20 (10%): "low" must drop below them.
    p = [0.01] * 200 + [0.04] * MIN_LOW_KIND + [0.3] * 100
    hits = [False] * 200 + [i < 2 for i in range(MIN_LOW_KIND)] + [True] * 100
    kinds = ["places"] * 200 + ["dates"] * MIN_LOW_KIND + ["places"] * 100
    assert MIN_LOW_KIND == 20  # one right answer in 20 is 5%: within the promise
    assert choose_bands(p, hits)[1] == 0.05  # pooled: 2 right of 220
    assert choose_bands(p, hits, groups=kinds)[1] == 0.04
    # One right answer in the kind's 20 keeps the promise (5%), and so does a kind with fewer answers
    # under the cut than the minimum, however many of them are right: they do not move the cut.
    one = [False] * 200 + [i < 1 for i in range(MIN_LOW_KIND)] + [True] * 100
    assert choose_bands(p, one, groups=kinds)[1] == 0.05
    few = MIN_LOW_KIND - 1
    p_few = [0.01] * 200 + [0.04] * few + [0.3] * 100
    hits_few = [False] * 200 + [i < 3 for i in range(few)] + [True] * 100
    kinds_few = ["places"] * 200 + ["dates"] * few + ["places"] * 100
    assert choose_bands(p_few, hits_few, groups=kinds_few)[1] == 0.05


def test_calibrate_lowers_low_until_every_kind_left_out_keeps_its_promise() -> None:
    # Few votes are almost never right, but a fit that never saw a kind does not know its own rate: with
    # kinds left out, one kind's answers under 0.05 are right more than 5% of the time though all kinds'
    # together and relations left out keep the promise. The cut drops until each kind keeps it.
    rng = np.random.default_rng(11)
    relations = ("P19", "P20", "P103", "P1412", "P106", "P101", "P108", "P463", "P569", "P0569")
    rows = []
    for i in range(1000):
        relation = relations[i % len(relations)]
        votes = int(rng.integers(1, 20))
        found = Signals(0.5, 0.1, votes, 20, votes / 20, votes > 10, 0.5, 1.0, 20, 1.0, KindSignals())
        rate = 0.2 if relation in ("P569", "P0569") and votes <= 3 else (votes / 20) ** 3
        rows.append(Measured(str(i), relation, found, bool(rng.random() < rate)))
    hits = np.array([r.hit for r in rows])
    kinds = np.array([kind(r.relation) for r in rows])
    p_kind, _ = kinds_left_out(rows)
    assert choose_bands(p_kind, hits)[1] == choose_bands(left_out(rows), hits)[1] == 0.05
    _, check = calibrate(rows)
    cut = check["bands"]["medium"]
    assert cut < 0.05 and check["bands"]["low_checked_per_kind_from"] == MIN_LOW_KIND
    broken = [k for k in set(kinds) if hits[(p_kind < 0.05) & (kinds == k)].mean() > 0.05]
    assert broken  # at 0.05 some kind left out breaks the promise
    for name in set(kinds):
        under = (p_kind < cut) & (kinds == name)
        assert under.sum() < MIN_LOW_KIND or hits[under].mean() <= 0.05, name
