"""The server's idle completion looks for partly encoded articles only after questions that encoded: on an
engine that look is a search request, which a warm question (nothing encoded) does not owe."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from bertknn_search.config import Config
from bertknn_search.records import Answer, EncodePlan, EncodeProgress, Question
from bertknn_search.server import batcher as batcher_module
from bertknn_search.server.batcher import MicroBatcher

WAIT_S = 60.0


class Waits(queue.Queue):  # type: ignore[type-arg]
    """The batcher's queue, counting the times its worker waited with nothing else to do."""

    def __init__(self, maxsize: int) -> None:
        super().__init__(maxsize)
        self.idle = threading.Condition()
        self.waits = 0

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and timeout is None:
            with self.idle:
                self.waits += 1
                self.idle.notify_all()
        return super().get(block, timeout)

    def reached(self, waits: int) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.waits >= waits, WAIT_S)


class Fake:
    """A Searcher over a lazy index: ``encodes`` contexts per question (reported as a lazy encode does)."""

    def __init__(self, encodes: list[int]) -> None:
        self.config = Config()
        self.hooks: Any = None
        self.encodes = encodes
        self.looks = 0  # calls of the idle completion's encode_more
        self.encoder = SimpleNamespace(
            mlm=None,
            vocab=None,
            has_head=True,
            placement=SimpleNamespace(device=SimpleNamespace(type="cpu")),
            prepare=lambda text: None,
        )
        self.backend = SimpleNamespace(encode_more=self.encode_more)

    def encode_more(self, max_contexts: int, plan: EncodePlan | None = None) -> int:
        self.looks += 1
        return 0

    def answer_batch(self, questions: Sequence[Question]) -> list[Answer]:
        n = self.encodes.pop(0)
        if n:
            self.hooks.progress(EncodeProgress(done=n, todo=n, titles=("Town",), seconds=0.1))
        return [Answer(q.text, None, [], [], None, [], [], 0) for q in questions]

    def close(self) -> None:
        pass


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[MicroBatcher, Fake, Waits]]:
    monkeypatch.setattr(batcher_module, "IDLE_AFTER_S", 0.0)  # the look is due as soon as nobody asks
    fake = Fake([0, 0, 5])
    batcher = MicroBatcher(lambda: fake, 1, 0.0, 16)  # type: ignore[arg-type, return-value]
    waits = Waits(16)
    batcher._queue = waits
    batcher.start()
    yield batcher, fake, waits
    batcher.stop()


def ask(batcher: MicroBatcher) -> None:
    (future,) = batcher.submit([Question("The town lies on the [MASK].")], Config())
    future.result(WAIT_S)


def test_warm_questions_owe_no_look_and_an_encoding_one_does(
    started: tuple[MicroBatcher, Fake, Waits],
) -> None:
    batcher, fake, waits = started
    assert waits.reached(1) and fake.looks == 1  # once at start: another process may have left some
    for waited in (2, 3):  # two warm questions, each followed by the worker waiting for the next
        ask(batcher)
        assert waits.reached(waited)
        assert fake.looks == 1
    ask(batcher)  # encodes 5 contexts: it may have left an article partly encoded
    assert waits.reached(4)
    assert fake.looks == 2
