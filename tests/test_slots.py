"""The one slot store of K/V memory (kv/slots.py): rows join and leave in any order and each
row's tensors stay its own; a departure copies only the rows it displaces; widening keeps what
it is told to; the last row leaving frees the memory."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unmask.kv.slots import SlotStore


def _store():
    s = SlotStore()
    s.group("k", {0: torch.zeros(0, 2, 3), 1: torch.zeros(0, 5)})
    s.group("pos", {False: torch.zeros(0, 4, dtype=torch.long)})
    return s


def _write(s: SlotStore, row: int, value: int) -> None:
    for group in s.groups.values():
        for t in group.values():
            t[row] = value


def _values(s: SlotStore) -> list[list[int]]:
    """Per tensor, each row's value (every entry of a row holds it)."""
    out = []
    for name in s.groups:
        for t in s.view(name).values():
            flat = t.reshape(t.shape[0], -1)
            assert bool((flat == flat[:, :1]).all())
            out.append(flat[:, 0].tolist())
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4), st.randoms()), min_size=1, max_size=25))
def test_rows_keep_their_tensors_through_joins_and_departures(ops):
    s, rows, next_id = _store(), [], 1
    for join, k, rnd in ops:
        if join or not rows:
            if not s.groups:  # freed with the last row: its owner allocates again
                s = _store()
            s.add(k)
            assert all(v[len(rows):] == [0] * k for v in _values(s))  # joining slots start zeroed
            for j in range(k):
                _write(s, len(rows), next_id)
                rows.append(next_id)
                next_id += 1
        else:
            gone = set(rnd.sample(range(len(rows)), min(k, len(rows))))
            m = len(rows) - len(gone)
            holes = [h for h in sorted(gone) if h < m]
            movers = [i for i in range(m, len(rows)) if i not in gone]
            perm = list(range(m))
            for h, src in zip(holes, movers):
                perm[h] = src
            s.keep(perm)
            rows = [rows[i] for i in perm]
        assert s.n == len(rows)
        if rows:
            assert all(v == rows for v in _values(s))
        else:
            assert not s.groups  # freed with the last row


def test_a_departure_copies_only_the_rows_it_displaces_and_joins_grow_by_half():
    s = _store()
    s.add(6)
    for i in range(6):
        _write(s, i, i + 1)
    before = s.groups["k"][0]
    s.add(1)  # full: half as large again
    assert s.slots == 9 and s.groups["k"][0] is not before
    kept = s.groups["k"][0]
    _write(s, 6, 7)
    s.keep([0, 6, 2, 3, 4, 5])  # row 1 leaves, the last row moves into its slot
    assert s.groups["k"][0] is kept and _values(s)[0] == [1, 7, 3, 4, 5, 6]
    s.add(2)  # free slots: no new memory
    assert s.groups["k"][0] is kept and s.n == 8 and _values(s)[0][6:] == [0, 0]


def test_widen_keeps_the_columns_it_is_told_to():
    s = SlotStore(2)
    s.group("k", {0: torch.ones(2, 1, 3, 2), 1: torch.ones(2, 1, 5, 2)})
    s.widen("k", 2, 4, keep=2, keys=[0])
    a, b = s.groups["k"][0], s.groups["k"][1]
    assert a.shape == (2, 1, 4, 2) and a[:, :, :2].eq(1).all() and a[:, :, 2:].eq(0).all()
    assert b.shape == (2, 1, 5, 2)  # not named: unchanged
    s.widen("k", 2, 4)  # already that wide: unchanged
    assert s.groups["k"][0] is a
    assert s.bytes == (2 * 4 * 2 + 2 * 5 * 2) * 4
