"""Type-aware input mutation (EvalPlus section 2.1): new inputs made by small, type-preserving edits of seeds.

Rules, as EvalPlus lists them: an int moves by one or to a random nearby value; a float is perturbed; a bool
flips; a string gets a character inserted, deleted or replaced, or a substring of another seed string spliced
in; a list gets an element inserted (a mutated copy of one of its own), deleted, replaced by a mutation of
itself, or two elements swapped; a tuple keeps its length (tuples are records: a point, an interval) and
mutates one element; a dict gets a key or a value mutated, a pair added or dropped; containers recurse.

Mutation also keeps each value near the domain its seed shows, since the problem's stated preconditions are
not machine-readable (EvalPlus wrote contracts by hand): an int keeps its sign class (negative, zero or more,
one or more), a float its sign, and a string draws new characters from the characters the problem's seed
strings use. What still breaks a precondition is caught later: an input on which the reference raises or
runs too long is rejected. Everything is drawn from one ``random.Random``, so a seed gives the same inputs.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 6


@dataclass
class Pool:
    """What the seeds of one problem contain: characters and strings to splice from, ints and floats to reuse."""

    chars: str = string.ascii_letters
    strings: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, seeds: list[tuple[Any, ...]]) -> Pool:
        strings: list[str] = []

        def walk(v: Any, depth: int = 0) -> None:
            if depth > MAX_DEPTH:
                return
            if type(v) is str:
                strings.append(v)
            elif type(v) in (list, tuple, set, frozenset):
                for x in v:
                    walk(x, depth + 1)
            elif type(v) is dict:
                for k, x in v.items():
                    walk(k, depth + 1)
                    walk(x, depth + 1)

        for args in seeds:
            walk(args)
        chars = "".join(sorted({c for s in strings for c in s}))
        return cls(chars=chars or string.ascii_letters, strings=sorted(set(strings)))


class Mutator:
    """``Mutator(rng, pool).mutate_args(args)``: one new argument tuple, of the same types as ``args``."""

    def __init__(self, rng: random.Random, pool: Pool) -> None:
        self.rng = rng
        self.pool = pool

    def mutate_args(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        if not args:
            return args
        out = list(args)
        positions = list(range(len(args)))
        self.rng.shuffle(positions)
        for i in positions[:self.rng.randint(1, len(args))]:
            out[i] = self.mutate(out[i])
        return tuple(out)

    def mutate(self, v: Any, depth: int = 0) -> Any:
        """A value of the same type as ``v`` (of the same element types, for containers)."""
        if depth > MAX_DEPTH:
            return v
        kind = type(v)
        if kind is bool:
            return not v
        if kind is int:
            return self._int(v)
        if kind is float:
            return self._float(v)
        if kind is str:
            return self._str(v)
        if kind is list:
            return self._list(v, depth)
        if kind is tuple:
            if not v:
                return v
            i = self.rng.randrange(len(v))
            return v[:i] + (self.mutate(v[i], depth + 1),) + v[i + 1:]
        if kind in (set, frozenset):
            items = self._list(sorted(v, key=repr), depth)
            try:
                return kind(items)
            except TypeError:
                return v
        if kind is dict:
            return self._dict(v, depth)
        return v  # None, bytes, complex: kept

    def _int(self, v: int) -> int:
        r = self.rng.random()
        if r < 0.5:
            new = v + self.rng.choice((-1, 1))
        else:
            spread = max(3, abs(v))
            new = v + self.rng.randint(-spread, spread)
        floor = 1 if v >= 1 else 0 if v >= 0 else None
        if floor is not None:
            return max(floor, new)
        return min(-1, new)

    def _float(self, v: float) -> float:
        r = self.rng.random()
        if r < 0.4:
            new = v + self.rng.choice((-1.0, 1.0))
        elif r < 0.8:
            new = v * self.rng.uniform(0.5, 1.5)
        else:
            new = v + self.rng.uniform(-1.0, 1.0)
        new = round(new, 4)
        if v > 0:
            return new if new > 0 else abs(new) or 0.5
        if v < 0:
            return new if new < 0 else -(abs(new) or 0.5)
        return abs(new)

    def _char(self) -> str:
        return self.rng.choice(self.pool.chars)

    def _str(self, s: str) -> str:
        ops = ["insert", "splice"] + (["delete", "replace", "duplicate"] if s else [])
        op = self.rng.choice(ops)
        i = self.rng.randrange(len(s) + 1)
        if op == "insert":
            return s[:i] + self._char() + s[i:]
        if op == "splice":
            donor = self.rng.choice(self.pool.strings) if self.pool.strings else self._char()
            if donor:
                a = self.rng.randrange(len(donor))
                b = self.rng.randint(a + 1, len(donor))
                donor = donor[a:b]
            return s[:i] + donor + s[i:]
        j = min(i, len(s) - 1)
        if op == "delete":
            return s[:j] + s[j + 1:]
        if op == "replace":
            return s[:j] + self._char() + s[j + 1:]
        k = self.rng.randint(j + 1, len(s))
        return s[:k] + s[j:k] + s[k:]  # duplicate a substring in place

    def _list(self, v: list[Any], depth: int) -> list[Any]:
        out = list(v)
        if not out:
            return out  # no element to learn the type from: an empty list stays empty
        ops = ["insert", "replace", "duplicate"] + (["delete", "swap"] if len(out) > 1 else ["delete"])
        op = self.rng.choice(ops)
        i = self.rng.randrange(len(out))
        if op == "insert":
            out.insert(self.rng.randrange(len(out) + 1), self.mutate(out[i], depth + 1))
        elif op == "duplicate":
            out.insert(self.rng.randrange(len(out) + 1), out[i])
        elif op == "replace":
            out[i] = self.mutate(out[i], depth + 1)
        elif op == "delete":
            del out[i]
        else:
            j = self.rng.randrange(len(out))
            out[i], out[j] = out[j], out[i]
        return out

    def _dict(self, v: dict[Any, Any], depth: int) -> dict[Any, Any]:
        if not v:
            return v
        items = list(v.items())
        i = self.rng.randrange(len(items))
        k, x = items[i]
        op = self.rng.choice(["key", "value", "add", "drop"] if len(items) > 1 else ["key", "value", "add"])
        out = dict(items)
        if op == "value":
            out[k] = self.mutate(x, depth + 1)
        elif op == "key":
            new = self.mutate(k, depth + 1)
            if new not in out:
                del out[k]
                out[new] = x
        elif op == "add":
            new = self.mutate(k, depth + 1)
            if new not in out:
                out[new] = self.mutate(x, depth + 1)
        else:
            del out[k]
        return out
