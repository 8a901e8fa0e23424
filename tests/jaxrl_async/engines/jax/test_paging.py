"""Page pool and page tables: prefix sharing, growth, release, and no page ever leaks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxrl_async.engines.jax.paging import PagePool, PageTables


def test_a_group_shares_its_full_prompt_pages_and_copies_its_partial_last_page():
    tables = PageTables(num_slots=4, max_len=32, page_size=4, total_pages=20)
    # prefix of 10 positions: pages 0-1 full (shared), page 2 partial (copied); first call to 12.
    assert tables.group_need(10, 3, 12) == 2 + 3 * 1
    copies = tables.admit_group([0, 2, 3], prefix_len=10, end=12)
    shared = tables.pages[0][:2]
    assert tables.pages[2][:2] == shared and tables.pages[3][:2] == shared
    assert [tables.pool.refs(p) for p in shared] == [3, 3]
    assert copies == [(tables.pages[0][2], tables.pages[2][2]), (tables.pages[0][2], tables.pages[3][2])]
    assert tables.pool.used == 5
    tables.check()
    tables.release(0)
    assert [tables.pool.refs(p) for p in shared] == [2, 2] and tables.pool.used == 4
    tables.release(2)
    tables.release(3)
    assert tables.pool.free == 20
    tables.check()


def test_a_prompt_that_fills_whole_pages_needs_no_copy():
    tables = PageTables(num_slots=2, max_len=32, page_size=4, total_pages=8)
    assert tables.admit_group([0, 1], prefix_len=8, end=9) == []
    assert tables.pages[0][:2] == tables.pages[1][:2] and tables.pages[0][2] != tables.pages[1][2]


def test_growth_takes_pages_only_at_page_boundaries_and_the_table_names_them():
    tables = PageTables(num_slots=2, max_len=16, page_size=4, total_pages=4)
    tables.admit_group([1], prefix_len=0, end=1)
    assert tables.need(1, 4) == 0 and tables.need(1, 5) == 1 and tables.need(1, 16) == 3
    tables.grow(1, 9)
    assert list(tables.table[1]) == [*tables.pages[1], 4]  # 4: the out-of-range sentinel
    assert list(tables.table[0]) == [4] * 4
    with pytest.raises(RuntimeError, match="2 pages asked, 1 free"):
        tables.pool.take(2)


def test_the_pool_refuses_to_release_a_free_page():
    pool = PagePool(2)
    (page,) = pool.take(1)
    pool.release([page])
    with pytest.raises(AssertionError, match="release of free page"):
        pool.release([page])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["admit", "grow", "release"]), st.integers(0, 5),
                          st.integers(0, 31), st.integers(1, 3)), max_size=60))
def test_pages_never_leak_over_random_admit_grow_release_sequences(ops):
    """free + used = total and reference counts = table holders after every operation, and all
    pages are free again once every slot lets go."""
    tables = PageTables(num_slots=6, max_len=32, page_size=4, total_pages=24)
    for op, slot, position, n in ops:
        if op == "admit":
            slots = [s for s in range(6) if not tables.pages[s]][:n]
            prefix = min(position, 30)
            need = tables.group_need(prefix, len(slots), prefix + 1)
            if slots and need <= tables.pool.free:
                tables.admit_group(slots, prefix, prefix + 1)
        elif op == "grow" and tables.pages[slot]:
            end = max(position + 1, len(tables.pages[slot]) * 4)
            if tables.need(slot, end) <= tables.pool.free:
                tables.grow(slot, end)
        elif op == "release":
            tables.release(slot)
        tables.check()
    for slot in range(6):
        tables.release(slot)
    tables.check()
    assert tables.pool.free == 24
