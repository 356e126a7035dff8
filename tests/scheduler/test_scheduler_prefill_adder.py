"""PrefillAdder and AdmissionPolicy: budgets, chunking, reservation, fifo and pack, exactly."""

from collections import deque

import numpy as np

from zserve.common.sampling_params import SamplingParams
from zserve.scheduler_proc.admission_policy import AdmissionPolicy
from zserve.scheduler_proc.cache_manager import CacheManager
from zserve.scheduler_proc.kv_reservation import KvReservation
from zserve.scheduler_proc.prefill_adder import AddOutcome, PrefillAdder
from zserve.scheduler_proc.req import PendingReq
from zserve.scheduler_proc.req_table import ReqTable


def pending(req_id: int, prompt, max_tokens: int = 4, page_size: int = 1) -> PendingReq:
    prompt = np.array(prompt if not isinstance(prompt, int) else range(1000 * req_id, 1000 * req_id + prompt), np.int32)
    max_num_pages = -(-(len(prompt) + max_tokens - 1) // page_size)
    return PendingReq(req_id, prompt, len(prompt), SamplingParams(max_tokens=max_tokens), max_tokens, 0, frozenset(), max_num_pages)


def make(num_pages=64, page_size=1, rows=8):
    return CacheManager(num_pages, page_size, enable_radix_cache=True), ReqTable(rows)


def adder(cache, table, token_budget, reserved_size=0, reservation="full", **kw):
    """Most tests here describe the `full` reservation: every request reserves prompt + max_tokens."""
    return PrefillAdder(
        token_budget=token_budget, reserved_size=reserved_size, reservation=KvReservation(reservation, cache.page_size),
        cache=cache, req_table=table, **kw,
    )


def test_a_prompt_longer_than_the_budget_is_chunked_never_refused():
    cache, table = make(num_pages=128)
    a = adder(cache, table, token_budget=8)
    assert a.try_add(pending(1, 30)) is AddOutcome.ADMITTED
    assert a.extend_lens == [8] and a.token_budget == 0
    assert a.chunked is not None and a.chunked.req.req_id == 1
    assert a.try_add(pending(2, 1)) is AddOutcome.NO_BUDGET
    sizes = [8]
    chunked = a.chunked
    while chunked is not None:  # the continuation takes min(budget, remaining) each step
        chunked.req.cached_len += sizes[-1]
        nxt = adder(cache, table, token_budget=8)
        nxt.add_chunked(chunked)
        sizes.append(nxt.extend_lens[0])
        chunked = nxt.chunked
    assert sizes == [8, 8, 8, 6]


def test_admission_counts_reserved_size_and_rechecks_after_locking_the_prefix():
    cache, table = make(num_pages=8)
    shared = np.arange(50, 54, dtype=np.int32)
    cache.tree.insert(shared, cache.alloc(4))  # 4 cached pages (evictable) + 4 free
    req = pending(1, [*shared, 99], max_tokens=4)  # needs 5 + 4 - 1 = 8 pages, 4 of them cached
    # 4 needed + 2 reserved fit in 4 free + 4 evictable, but locking the prefix removes 4 evictable
    a = adder(cache, table, token_budget=16, reserved_size=2)
    assert a.try_add(req) is AddOutcome.NO_MEMORY
    assert cache.num_evictable_pages == 4 and table.num_free_rows == 8  # lock and row given back
    a = adder(cache, table, token_budget=16, reserved_size=0)
    assert a.try_add(req) is AddOutcome.ADMITTED
    r = a.reqs[0]
    assert r.cached_len == 4 and r.page_table[:5].tolist() == [0, 1, 2, 3, 4] and a.extend_lens == [1]
    assert a.reserved_size == 3  # 8 pages promised, 4 hit, 1 allocated now


def test_no_row_stops_admission():
    cache, table = make(rows=1)
    a = adder(cache, table, token_budget=64)
    assert a.try_add(pending(1, 3)) is AddOutcome.ADMITTED
    assert a.try_add(pending(2, 3)) is AddOutcome.NO_ROW


def test_fifo_never_overtakes_a_head_that_does_not_fit():
    cache, table = make(num_pages=20)
    queue = deque([pending(1, 10, max_tokens=8), pending(2, 2), pending(3, 2)])  # 17, 5 and 5 pages
    fifo = AdmissionPolicy("fifo", lookahead=64, force_fifo_every=8)
    a = adder(cache, table, token_budget=64, reserved_size=5)  # running requests may still write 5
    fifo.admit(a, queue)
    assert a.reqs == [] and [p.req_id for p in queue] == [1, 2, 3]
    pack = AdmissionPolicy("pack", lookahead=64, force_fifo_every=8)
    pack.admit(a, queue)  # pack skips the head that does not fit
    assert [r.req_id for r in a.reqs] == [2, 3] and [p.req_id for p in queue] == [1]


def test_fifo_admits_in_order_until_the_budget_is_spent():
    cache, table = make()
    queue = deque([pending(1, 5), pending(2, 2), pending(3, 6), pending(4, 1)])
    a = adder(cache, table, token_budget=10)
    AdmissionPolicy("fifo", 64, 8).admit(a, queue)
    assert [(r.req_id, n) for r, n in zip(a.reqs, a.extend_lens, strict=True)] == [(1, 5), (2, 2), (3, 3)]
    assert a.chunked.req.req_id == 3 and [p.req_id for p in queue] == [4]


def test_pack_fills_the_budget_smallest_first_and_the_forced_fifo_step_admits_the_long_head():
    cache, table = make(num_pages=256)
    queue = deque([pending(1, 20), pending(2, 4), pending(3, 3), pending(4, 3), pending(5, 1)])
    pack = AdmissionPolicy("pack", lookahead=4, force_fifo_every=2)
    a = adder(cache, table, token_budget=10)
    pack.admit(a, queue)  # window [1, 2, 3, 4]; 5 is beyond the lookahead
    assert [(r.req_id, n) for r, n in zip(a.reqs, a.extend_lens, strict=True)] == [(3, 3), (4, 3), (2, 4)]  # stable: 3 before 4
    assert a.token_budget == 0 and [p.req_id for p in queue] == [1, 5]
    b = adder(cache, table, token_budget=10)
    pack.admit(b, queue)  # the second step is fifo: the long head goes first, chunked
    assert [(r.req_id, n) for r, n in zip(b.reqs, b.extend_lens, strict=True)] == [(1, 10)]
    assert b.chunked.req.req_id == 1 and [p.req_id for p in queue] == [5]


def test_pack_skips_what_does_not_fit_and_keeps_queue_order_of_the_rest():
    cache, table = make(num_pages=24)
    queue = deque([pending(1, 2, max_tokens=20), pending(2, 3), pending(3, 9, max_tokens=20), pending(4, 2)])
    a = adder(cache, table, token_budget=64, reserved_size=10)  # 14 pages left: 21 no, 6 yes, 28 no, 5 yes
    AdmissionPolicy("pack", 64, 8).admit(a, queue)
    assert [r.req_id for r in a.reqs] == [4, 2] and [p.req_id for p in queue] == [1, 3]


def test_an_identical_prompt_shares_its_kv_and_a_shared_prefix_waits_for_its_page():
    cache, table = make(page_size=2)
    a = adder(cache, table, token_budget=64)
    assert a.try_add(pending(1, [1, 2, 3, 4, 5], page_size=2)) is AddOutcome.ADMITTED
    assert a.try_add(pending(2, [1, 2, 3, 4, 5], page_size=2)) is AddOutcome.ADMITTED  # takes 1's K/V
    assert a.try_add(pending(3, [1, 2, 7, 7, 7], page_size=2)) is AddOutcome.WAIT_FOR_PREFIX  # shares page [1, 2]
    assert a.try_add(pending(4, [1, 9, 3], page_size=2)) is AddOutcome.ADMITTED  # shares no whole page
    assert a.try_add(pending(5, [1, 2], page_size=2)) is AddOutcome.ADMITTED  # cannot match its only page anyway
    assert a.try_add(pending(6, [1, 2, 3, 4, 5], page_size=2)) is AddOutcome.ADMITTED  # takes 1's K/V too
    assert [r.req_id for r in a.reqs] == [1, 2, 4, 5, 6] and a.extend_lens == [5, 5, 3, 2, 5]
    assert a.kv_source == [None, 0, None, None, 0]
    assert a.token_budget == 64 - 5 - 3 - 2  # a KV-sharing request costs no budget
    assert a.reqs[1].page_table[:3].tolist() == [3, 4, 5]  # its own pages (the worker copies into them) ...
    assert (a.reqs[1].num_pages, a.reqs[1].max_num_pages) == (3, 4)  # ... and its reservation (full: all it may write)
    assert a.reserved_size == 2 * sum(r.max_num_pages - r.num_pages for r in a.reqs)


def test_kv_sharing_needs_no_budget_but_rows_and_memory():
    same = list(range(50, 60))  # 10 tokens, the whole budget; 4 pages of 4 with max_tokens 4
    cache, table = make(num_pages=64, page_size=4, rows=3)
    a = adder(cache, table, token_budget=10)
    assert a.try_add(pending(1, same, page_size=4)) is AddOutcome.ADMITTED and a.token_budget == 0
    assert a.try_add(pending(2, [7] * 3, page_size=4)) is AddOutcome.NO_BUDGET
    assert a.try_add(pending(3, same, page_size=4)) is AddOutcome.ADMITTED
    assert a.try_add(pending(4, same, page_size=4)) is AddOutcome.ADMITTED
    assert a.try_add(pending(5, same, page_size=4)) is AddOutcome.NO_ROW
    assert a.kv_source == [None, 0, 0] and a.extend_lens == [10, 10, 10] and a.chunked is None
    cache, table = make(num_pages=11, page_size=4)
    a = adder(cache, table, token_budget=10)
    assert a.try_add(pending(1, same, page_size=4)) is AddOutcome.ADMITTED
    assert a.try_add(pending(3, same, page_size=4)) is AddOutcome.ADMITTED
    assert a.try_add(pending(4, same, page_size=4)) is AddOutcome.NO_MEMORY  # 3 pages left of the 11
    cache, table = make(num_pages=64, page_size=4)
    a = adder(cache, table, token_budget=10, max_new_reqs=2)
    assert [a.try_add(pending(i, same, page_size=4)) for i in (1, 2, 3)] == [
        AddOutcome.ADMITTED, AddOutcome.ADMITTED, AddOutcome.REQUEST_CAP,  # a KV-sharing request is a request admitted
    ]


def test_a_chunked_prompt_makes_identical_ones_wait_for_its_pages():
    cache, table = make(page_size=4)
    same = list(range(30, 50))
    a = adder(cache, table, token_budget=8)
    assert a.try_add(pending(1, same, page_size=4)) is AddOutcome.ADMITTED and a.chunked is not None
    assert a.try_add(pending(2, same, page_size=4)) is AddOutcome.NO_BUDGET
    b = adder(cache, table, token_budget=30)
    assert b.try_add(pending(2, same, page_size=4)) is AddOutcome.ADMITTED  # nothing computes it now
    assert b.try_add(pending(3, same, page_size=4)) is AddOutcome.ADMITTED and b.kv_source == [None, 0]


def test_the_last_chunk_of_a_chunked_req_is_a_kv_source_when_it_starts_where_a_sharer_would():
    cache, table = make(page_size=4)
    same = np.arange(30, 50, dtype=np.int32)
    a = adder(cache, table, token_budget=8)
    assert a.try_add(pending(1, same, page_size=4)) is AddOutcome.ADMITTED
    chunked = a.chunked
    chunked.req.cached_len = 8  # the step returned: its 2 full pages go to the tree
    cache.cache_req(chunked.req)
    b = adder(cache, table, token_budget=12)
    b.add_chunked(chunked)  # its last 12 tokens, from 8 (page-aligned)
    assert b.try_add(pending(2, same, page_size=4)) is AddOutcome.ADMITTED
    assert b.kv_source == [None, 0] and b.extend_lens == [12, 12] and b.reqs[1].cached_len == 8
    chunked.req.cached_len = 6  # had its last chunk started mid-page, an identical prompt could match only 4 tokens
    c = adder(cache, table, token_budget=14)
    c.add_chunked(chunked)
    assert c.try_add(pending(3, same, page_size=4)) is AddOutcome.NO_BUDGET


def test_pack_admits_kv_sharing_requests_past_a_request_the_budget_stops():
    cache, table = make(num_pages=128)
    same = list(range(10, 16))
    queue = deque([pending(1, same), pending(2, list(range(70, 76))), pending(3, same), pending(4, 2)])
    a = adder(cache, table, token_budget=8)
    AdmissionPolicy("pack", 64, 8).admit(a, queue)  # offered 4, 1, 2, 3: 2 finds no budget left
    assert [r.req_id for r in a.reqs] == [4, 1, 3] and a.kv_source == [None, None, 1]
    assert a.extend_lens == [2, 6, 6] and [p.req_id for p in queue] == [2]
    queue = deque([pending(5, same), pending(6, same)])
    b = adder(cache, table, token_budget=4)
    AdmissionPolicy("pack", 64, 8).admit(b, queue)  # 5 is chunked: 6 cannot take its K/V
    assert [r.req_id for r in b.reqs] == [5] and [p.req_id for p in queue] == [6]


def test_the_request_cap_stops_new_admissions_but_not_the_chunked_continuation():
    cache, table = make(num_pages=128)
    a = adder(cache, table, token_budget=6, max_new_reqs=2)
    assert a.try_add(pending(1, 10)) is AddOutcome.ADMITTED  # chunked: 6 of 10
    b = adder(cache, table, token_budget=64, max_new_reqs=2)
    a.chunked.req.cached_len += 6
    b.add_chunked(a.chunked)  # a continuation is not a new admission
    assert [b.try_add(pending(i, 2)) for i in (2, 3, 4)] == [AddOutcome.ADMITTED, AddOutcome.ADMITTED, AddOutcome.REQUEST_CAP]
    queue = deque([pending(5, 1), pending(6, 1), pending(7, 1)])
    c = adder(cache, table, token_budget=64, max_new_reqs=1)
    AdmissionPolicy("pack", 64, 8).admit(c, queue)
    assert [r.req_id for r in c.reqs] == [5] and [p.req_id for p in queue] == [6, 7]


def test_the_estimated_reservation_admits_what_the_full_one_refuses():
    cache, table = make(num_pages=20)
    # 2 prompt tokens, max_tokens 19: full needs 20 pages, estimated 2 + ceil(18 * 0.7) = 15
    assert adder(cache, table, token_budget=64, reserved_size=1).try_add(pending(1, 2, max_tokens=19)) is AddOutcome.NO_MEMORY
    a = adder(cache, table, token_budget=64, reserved_size=5, reservation="estimated")
    assert a.try_add(pending(2, 2, max_tokens=19)) is AddOutcome.ADMITTED
    assert a.reserved_size == 5 + 15 - 2  # its reservation, less the 2 pages its prompt took now
    assert a.try_add(pending(3, 1, max_tokens=1)) is AddOutcome.NO_MEMORY  # 1 more page: 20 promised of 20
