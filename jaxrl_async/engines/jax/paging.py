"""Host-side bookkeeping of the paged KV cache: a pool of fixed-size pages and a page table per slot.

Pure Python + NumPy, no JAX. With `engine.page_size` = P > 0 the KV cache is `kv_pages` pages of
P positions each (`init_paged_cache`), not `num_slots` rows of `max_len`; a slot's position j
lives at offset j % P of page `table[slot, j // P]`. A sequence takes pages as it grows
(`grow`) and returns them when it ends (`release`: finish, abort or preemption), so the cache
holds what the live sequences use, not what `max_len` reservations would.

Prefix sharing: the n samples of one request share its prompt's full pages read-only (one
prefill, one copy of their keys/values, a reference count per page); the partially filled last
prompt page is copied into each other sample's own first page (`admit_group` returns the
copies), because every sample writes its own tokens after the prompt into that page. A shared
page is never written again: writes happen only at positions past the prompt.

Invariant (`check`): every page is either free (reference count 0, on the free list) or used
(count = the number of slot tables that hold it); free + used = total, always.

Sentinel: table entries past a slot's pages hold `total` (out of range): a device write there is
dropped and a read (clamped onto a real page) is masked, never used.
"""

from __future__ import annotations

import numpy as np


class PagePool:
    """`total` pages, each free or held by one or more slots (a reference count)."""

    def __init__(self, total: int):
        self.total = total
        self._free = list(range(total - 1, -1, -1))  # pop() hands out the lowest id first
        self._refs = [0] * total

    @property
    def free(self) -> int:
        return len(self._free)

    @property
    def used(self) -> int:
        return sum(r > 0 for r in self._refs)

    def refs(self, page: int) -> int:
        return self._refs[page]

    def take(self, count: int) -> list[int]:
        """`count` fresh pages (reference count 1); the caller checks `free` first."""
        if count > len(self._free):
            raise RuntimeError(f"PagePool.take: {count} pages asked, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(count)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def share(self, page: int) -> None:
        assert self._refs[page] > 0, f"share of free page {page}"
        self._refs[page] += 1

    def release(self, pages: list[int]) -> None:
        for p in pages:
            assert self._refs[p] > 0, f"release of free page {p}"
            self._refs[p] -= 1
            if not self._refs[p]:
                self._free.append(p)


class PageTables:
    """The pages of every slot: what the paged engine core asks before it admits, grows, ends.

    `table` [num_slots, max_len // page_size] int32 is sent with every decode call.
    """

    def __init__(self, num_slots: int, max_len: int, page_size: int, total_pages: int):
        self.page_size = page_size
        self.pool = PagePool(total_pages)
        self.pages: list[list[int]] = [[] for _ in range(num_slots)]
        self.table = np.full((num_slots, max_len // page_size), total_pages, np.int32)

    def pages_for(self, positions: int) -> int:
        """Pages that hold positions [0, positions)."""
        return -(-positions // self.page_size)

    def group_need(self, prefix_len: int, n: int, end: int) -> int:
        """Pages `admit_group` takes: the prefix's full pages once, and for each of the n samples
        its own pages from the prefix's partial page up to position `end` (exclusive)."""
        full = prefix_len // self.page_size
        return full + n * (self.pages_for(end) - full)

    def admit_group(self, slots: list[int], prefix_len: int, end: int) -> list[tuple[int, int]]:
        """Give `slots` (empty) pages for positions [0, end); the first prefix_len positions are
        the shared prompt, written once into slots[0]'s pages. Returns the (src, dst) page
        copies that give every other sample its own copy of the partial last prompt page."""
        full, partial = divmod(prefix_len, self.page_size)
        shared = self.pool.take(full)
        copies = []
        for i, slot in enumerate(slots):
            assert not self.pages[slot], f"slot {slot} still holds pages {self.pages[slot]}"
            if i:
                for p in shared:
                    self.pool.share(p)
            own = self.pool.take(self.pages_for(end) - full)
            self._set(slot, shared + own)
            if i and partial:
                copies.append((self.pages[slots[0]][full], own[0]))
        return copies

    def need(self, slot: int, end: int) -> int:
        """Pages the slot must still take to hold positions [0, end)."""
        return max(0, self.pages_for(end) - len(self.pages[slot]))

    def grow(self, slot: int, end: int) -> None:
        """Take the pages that positions [0, end) still need (the caller checks `need` first)."""
        self._set(slot, self.pages[slot] + self.pool.take(self.need(slot, end)))

    def release(self, slot: int) -> None:
        """Return the slot's pages (a shared page goes free once its last holder lets go)."""
        self.pool.release(self.pages[slot])
        self._set(slot, [])

    def _set(self, slot: int, pages: list[int]) -> None:
        self.pages[slot] = pages
        self.table[slot] = self.pool.total
        self.table[slot, :len(pages)] = pages

    def check(self) -> None:
        """Assert the invariant of the module docstring (tests call it after every step)."""
        holders = [0] * self.pool.total
        for pages in self.pages:
            for p in pages:
                holders[p] += 1
        refs = [self.pool.refs(p) for p in range(self.pool.total)]
        assert holders == refs, f"reference counts {refs} != table holders {holders}"
        free = set(self.pool._free)
        assert len(free) == self.pool.free, "a page is on the free list twice"
        assert free == {p for p in range(self.pool.total) if not refs[p]}, "free list != unreferenced pages"
        assert self.pool.free + self.pool.used == self.pool.total
        for slot, pages in enumerate(self.pages):
            assert list(self.table[slot, :len(pages)]) == pages
            assert (self.table[slot, len(pages):] == self.pool.total).all()
