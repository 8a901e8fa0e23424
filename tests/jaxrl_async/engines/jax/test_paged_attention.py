"""Decode attention over pages: the XLA gather and the Pallas kernel (interpret mode) against the
contiguous cache's attention."""

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_async.engines.jax.paged_attention import (gather_attention, kernel_for, paged_attend,
                                                     pallas_attention)
from jaxrl_async.models.attention import attention, write_kv

S, H, K, D, PS, PAGES = 3, 6, 2, 8, 4, 16  # 3 query heads per kv head: padded to 16 rows


def paged_and_contiguous(seed: int = 0, n: int = 4):
    """Random keys/values for 3 slots of n pages each, scattered over a pool of 16 pages, and the
    same positions laid out contiguously ([S, K, D, n * PS] / [S, K, n * PS, D])."""
    rng = np.random.default_rng(seed)
    k_pages = rng.normal(size=(PAGES, K, D, PS)).astype(np.float32)
    v_pages = rng.normal(size=(PAGES, K, PS, D)).astype(np.float32)
    table = rng.permutation(PAGES)[:S * n].reshape(S, n).astype(np.int32)
    kt = k_pages[table].transpose(0, 2, 3, 1, 4).reshape(S, K, D, n * PS)
    v = v_pages[table].transpose(0, 2, 1, 3, 4).reshape(S, K, n * PS, D)
    q = rng.normal(size=(S, 1, H, D)).astype(np.float32)
    return q, k_pages, v_pages, table, kt, v


def contiguous(q, kt, v, positions):
    mask = jnp.arange(kt.shape[-1])[None, None, :] <= positions[:, None, None]
    return attention(q, kt, v, mask)


def test_gather_attention_equals_the_contiguous_attention_bit_for_bit():
    q, k_pages, v_pages, table, kt, v = paged_and_contiguous()
    positions = np.array([0, 6, 15], np.int32)
    got = gather_attention(q, k_pages, v_pages, table, positions)
    np.testing.assert_array_equal(got, contiguous(q, kt, v, positions))


def test_pallas_kernel_in_interpret_mode_matches_the_gather_path_and_reads_only_live_pages():
    q, k_pages, v_pages, table, kt, v = paged_and_contiguous(seed=1)
    positions = np.array([2, 9, 15], np.int32)
    want = gather_attention(q, k_pages, v_pages, table, positions)
    got = pallas_attention(q, k_pages, v_pages, table, positions, interpret=True)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
    # Pages past a slot's position are never read: poisoning them changes nothing.
    poisoned = k_pages.copy(), v_pages.copy()
    for slot, pos in enumerate(positions):
        for page in table[slot, pos // PS + 1:]:
            poisoned[0][page], poisoned[1][page] = np.nan, np.nan
    again = pallas_attention(q, *poisoned, table, positions, interpret=True)
    np.testing.assert_allclose(again, want, atol=2e-6, rtol=1e-5)


def test_paged_attend_writes_the_token_into_its_page_and_offset_then_attends_to_it():
    q, k_pages, v_pages, table, kt, v = paged_and_contiguous(seed=2)
    positions = np.array([[1], [6], [13]], np.int32)
    k_new = np.ones((S, 1, K, D), np.float32)
    v_new = np.full((S, 1, K, D), 2.0, np.float32)
    active = np.array([True, True, False])
    out, (new_k, new_v) = paged_attend(jnp.asarray(k_pages), jnp.asarray(v_pages), table, positions,
                                       active)(q, k_new, v_new)
    # Slot 0 at 1: page table[0, 0], offset 1; slot 1 at 6: page table[1, 1], offset 2; slot 2 inactive.
    assert (new_k[table[0, 0], :, :, 1] == 1).all() and (new_v[table[1, 1], :, 2] == 2).all()
    np.testing.assert_array_equal(new_k[table[2, 3]], k_pages[table[2, 3]])
    rows = np.arange(S)[:, None]
    ref_kt, ref_v = write_kv(jnp.asarray(kt), jnp.asarray(v), k_new[:, 0], v_new[:, 0],
                             np.where(active, rows[:, 0], S), positions[:, 0])
    np.testing.assert_array_equal(out, contiguous(q, ref_kt, ref_v, positions[:, 0]))


def test_the_kernel_is_chosen_by_backend():
    assert kernel_for("cpu") == "xla"
    assert kernel_for("gpu") == "pallas" and kernel_for("tpu") == "pallas"
    assert kernel_for("something-else") == "xla"
    assert jax.default_backend() == "cpu"
