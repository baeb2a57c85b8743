"""Work spread over a pool's sandbox slots: each item borrows a free slot, runs on it, and gives it back; one
thread per slot (the threads only wait on sockets). The judge pool and the augmentation's batch runner both
dispatch this way."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")


def map_on_slots(slots: queue.Queue[S], workers: int, work: Callable[[S, T], R], items: Sequence[T],
                 on_done: Callable[[int, int], None] | None = None) -> list[R]:
    """``work(slot, item)`` for every item, results in input order; ``on_done(done, total)`` after each."""
    done = 0
    lock = threading.Lock()

    def one(item: T) -> R:
        nonlocal done
        slot = slots.get()
        try:
            return work(slot, item)
        finally:
            slots.put(slot)
            with lock:
                done += 1
                if on_done:
                    on_done(done, len(items))

    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(one, items))
