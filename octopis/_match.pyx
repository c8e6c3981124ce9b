# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled matcher: string cells and per-attribute bucket bitmaps (the design is
explained in octopis.matching).

Layout. Each subscription is compiled once, at ``add``, into a small C program of
``Pred`` records sorted by attribute; its ``=``, ``<``, ``<=``, ``>``, ``>=`` predicates on
one attribute merge into one closed interval of doubles. Attribute names and string
constants are interned to dense ids, reference counted and recycled when their last
subscription leaves (a string id only at the next build, since the bitmaps may name it).
A publication is loaded once per match into value slots per attribute id: ``val[2a]``
holds a's number and ``val[2a + 1]`` its string's id, NaN when a does not hold that kind,
so a range or string equality is one NaN-safe test ``lo <= val[slot] <= hi``; kind, epoch
and UTF-8 bytes serve the other operators.

Index, rebuilt lazily. Every live subscription gets a *slot*; the slots are ordered by
cell, by the attribute of the subscription's key range, by the attributes it tests where
over CHUNK/2 words of subscriptions test the same, and by the key range (the first range,
or where a group testing the same attributes is clearly more selective on another
attribute, the range there), and cut into words of 64:

* a *cell* is the slot range of the subscriptions accessed by one string lookup (their
  most selective ``eq``, ``str-prefix`` or ``str-postfix``, looked up by the
  publication's string and, for every prefix/postfix length used, by its prefix/suffix of
  that length); the *root* cell holds the subscriptions without one and is always scanned;
* per attribute, a *column* over the words holding a subscription that tests it (other
  than by its access predicate): numbers fall into up to NUM_BUCKETS buckets cut at
  quantiles of the ranges' boundaries, the STR_BUCKETS most frequent eq/neq constants
  get a bucket each, then NaN, any other string, absent; per bucket, a *sure* bitmap (the
  subscription's predicates on the attribute hold for every value of the bucket; a
  subscription that does not test the attribute has the bit) and the *edges* (those that
  hold for some values only), sorted by slot, each with how to decide it, and indexed by
  piece;
* words form *chunks* of at most CHUNK (a new one where a run of RUN or more words testing
  the same attributes begins); per chunk, each column has a *piece*, its positions there,
  the attribute of most of the chunk's key ranges first.

A publication points every column at its bucket. A scan, chunk by chunk in slot order,
ANDs into the live bits each piece's sure bits plus the edges that hold, checked only
for subscriptions still alive, and stops early once no bit is left; it prefetches the
next chunk's sure bits and edges. Every bit left is a match: ``match`` keeps the words
with one and builds its list from them (a borrowed key per slot, copied in slot order), ``match_groups`` takes
one per group. Subscriptions added since the last build wait in a pending list and are
verified in full; removed ones lose their live bit.

Files: this one holds the storage (ids, compiled programs) and the API;
``_match_interning.pxi`` interns attribute names and string constants,
``_match_index.pxi`` builds the index (its columns: ``_match_columns.pxi``),
``_match_query.pxi`` matches, ``_match_types.pxi`` declares the C types and helpers they
share.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.list cimport PyList_New
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact, PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_CheckExact, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_CheckExact
from libc.math cimport NAN, isfinite, isnan, nextafter
from libc.limits cimport INT_MAX
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport qsort
from libc.string cimport memcmp, memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from octopis.filters.language import Subscription

cdef extern from "Python.h":
    object PyType_GenericAlloc(object, Py_ssize_t)
    bint PyType_IsSubtype(object, object)

include "_match_types.pxi"
include "_match_interning.pxi"


MATCH_BUCKETS = (1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 1e-2)
"""Upper bounds (seconds) of :attr:`MatchClock.histogram`'s buckets; the last bucket is
everything slower."""
cdef enum:
    N_BUCKETS = 11
cdef double _BOUNDS[N_BUCKETS]


cdef int _load_bounds() except -1:
    if len(MATCH_BUCKETS) != N_BUCKETS:
        raise ImportError(f"MATCH_BUCKETS has {len(MATCH_BUCKETS)} bounds, N_BUCKETS {N_BUCKETS}")
    for b in range(N_BUCKETS):
        _BOUNDS[b] = MATCH_BUCKETS[b]
    return 0


_load_bounds()


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef class MatchClock:
    """Time spent in matchers and the number of matches (the paper's matching delay, §7.2),
    with a histogram of single match times over :data:`MATCH_BUCKETS`. A matcher given one
    (``Matcher(clock=...)``) records every ``match_groups`` and ``match_values`` in it, in
    C; a broker process gives one clock to every part of its routing table."""

    cdef readonly long long calls
    cdef readonly double seconds
    cdef long long counts[N_BUCKETS + 1]

    def observe(self, double seconds):
        """Count one match that took ``seconds``."""
        self._observe(seconds)

    cdef inline void _observe(self, double seconds) noexcept:
        cdef int b = 0
        while b < N_BUCKETS and seconds > _BOUNDS[b]:
            b += 1
        self.calls += 1
        self.seconds += seconds
        self.counts[b] += 1

    @property
    def histogram(self):
        """Matches per bucket of :data:`MATCH_BUCKETS`, then the slower ones."""
        return [self.counts[b] for b in range(N_BUCKETS + 1)]


def _closed_range(str op, double c):
    """``value op c`` as a closed interval of doubles (for the range operators)."""
    if op == "=":
        return c, c
    if op == "<":
        return -INF, nextafter(c, -INF)
    if op == "<=":
        return -INF, c
    if op == ">":
        return nextafter(c, INF), INF
    return c, INF


def check_entry(object subscription, object group):
    """Reject what no matcher stores: a non-Subscription, a group outside [0, 2**30)."""
    if not isinstance(subscription, Subscription):
        raise TypeError(f"expected a Subscription, got {type(subscription).__name__}")
    if group is not None and (type(group) is not int or not 0 <= group < 1 << 30):
        raise ValueError(f"group must be an integer in [0, 2**30), got {group!r}")


cdef class Matcher:
    """Compiled matcher; the API and the semantics are those of ``ReferenceMatcher``.

    Subscriptions added since the last build are verified one by one (they are
    *pending*) until ``match`` rebuilds the index: once more than ``pending_limit`` plus
    1/32 of the indexed subscriptions are pending and verifying them since the last build
    has cost about as much as a build (REBUILD_WORK verifications per indexed
    subscription), and at the latest once a quarter of the indexed ones more are pending.
    With k subscriptions added per match, a build then comes every √(2·REBUILD_WORK·n/k)
    matches or so, where builds and verifications cost about the same.
    """

    # subscriptions by internal id
    cdef dict _ids
    cdef list _keys
    cdef list _subs
    cdef list _free
    cdef int cap, n_ids, n_live, pending_limit
    cdef Pred** prog
    cdef int* prog_len
    cdef char* state
    cdef char* indexed
    cdef int* pend_pos
    cdef int* pending
    cdef int n_pending, n_indexed, n_dead
    cdef long long pending_work  # pending subscriptions verified since the last build
    cdef int* out
    # optional group of each subscription (-1: none) and the scratch marks of match_groups
    cdef int* grp
    cdef char* seen
    cdef int* out_grp
    cdef int* grp_live
    cdef int seen_cap, n_groups
    # interned attribute names and string constants
    cdef dict _attr_ids
    cdef list _attr_refs
    cdef list _free_attrs
    cdef dict _str_ids
    cdef list _str_text
    cdef list _str_bytes
    cdef list _str_refs
    cdef list _free_strs
    # the loaded publication, by attribute id; val[2a] holds a's number, val[2a + 1] the id
    # of a's string (-1 if no subscription uses it), NaN when a does not hold that kind
    cdef int acap
    cdef double* val
    cdef int n_loaded
    cdef uint32_t epoch
    cdef uint32_t* v_epoch
    cdef char* v_kind
    cdef int* v_sid
    cdef const char** v_str
    cdef Py_ssize_t* v_len
    cdef PyObject** v_obj
    cdef int* touched
    # the index: slots in scan order, live bits per word, chunks and their pieces,
    # columns (and the publication's bucket in each: its sure bits and its next edge to
    # test), cells (``visit``: the cells a publication looks up, to scan in slot order)
    cdef int built_attrs, built_strs, n_slots, n_words, n_cells, root_end
    cdef int* slot_of
    cdef int* slot_sub
    cdef int* slot_grp
    cdef PyObject** slot_key  # borrowed from _slot_keys: a removed subscription is never hit
    cdef list _slot_keys  # each slot's key, as a copy laid out in slot order (_slot_copy)
    cdef uint64_t* live
    cdef int* word_chunk
    cdef int* chunk_w0
    cdef int* chunk_off
    # per chunk, where all its subscriptions' key ranges are on one attribute: that
    # attribute (else -1) and the hull of those ranges
    cdef int* chunk_key
    cdef double* chunk_lo
    cdef double* chunk_hi
    cdef Piece* pieces
    cdef Column* columns
    cdef uint64_t** cur_sure
    cdef Edge** cur_edge
    cdef const int** cur_at
    cdef int* cur_pk
    cdef int* str_off
    cdef Cell* cells
    cdef int* visit
    cdef char* affixed
    cdef dict _affix_lengths
    # what a scan for ``match`` found: the words with a hit and their bits (``n_hit``)
    cdef int* hit_w
    cdef uint64_t* hit_bits
    cdef int n_hit
    cdef list _retired_strs  # string ids released since the last build
    cdef long long candidates
    cdef Py_ssize_t index_bytes
    cdef dict _stats
    cdef MatchClock _clock

    def __cinit__(self, *, int pending_limit=64, MatchClock clock=None):
        self._clock = clock
        self._ids = {}
        self._keys = []
        self._slot_keys = []
        self._subs = []
        self._free = []
        self._attr_ids = {}
        self._attr_refs = []
        self._free_attrs = []
        self._str_ids = {}
        self._str_text = []
        self._str_bytes = []
        self._str_refs = []
        self._free_strs = []
        self._retired_strs = []
        self._affix_lengths = {}
        self.pending_limit = max(0, pending_limit)
        self.epoch = 1
        self._stats = {"rebuilds": 0, "equality": 0, "prefix": 0, "postfix": 0, "root": 0,
                       "never": 0}

    def __dealloc__(self):
        cdef int i
        if self.prog != NULL:
            for i in range(self.n_ids):
                PyMem_Free(self.prog[i])
        PyMem_Free(self.prog)
        PyMem_Free(self.prog_len)
        PyMem_Free(self.state)
        PyMem_Free(self.indexed)
        PyMem_Free(self.pend_pos)
        PyMem_Free(self.pending)
        PyMem_Free(self.out)
        PyMem_Free(self.grp)
        PyMem_Free(self.slot_of)
        PyMem_Free(self.seen)
        PyMem_Free(self.out_grp)
        PyMem_Free(self.grp_live)
        PyMem_Free(self.val)
        PyMem_Free(self.v_epoch)
        PyMem_Free(self.v_kind)
        PyMem_Free(self.v_sid)
        PyMem_Free(<void*>self.v_str)
        PyMem_Free(self.v_len)
        PyMem_Free(self.v_obj)
        PyMem_Free(self.touched)
        _free_index(self)

    # ---- subscriptions ---------------------------------------------------------------

    cdef int _new_id(self) except -1:
        cdef int sub, old
        if self._free:
            return self._free.pop()
        sub = self.n_ids
        if sub >= self.cap:
            old = self.cap
            self.cap = max(64, 2 * self.cap)
            self.prog = <Pred**>_alloc(self.prog, self.cap * sizeof(Pred*))
            memset(self.prog + old, 0, (self.cap - old) * sizeof(Pred*))
            self.prog_len = <int*>_alloc(self.prog_len, self.cap * sizeof(int))
            self.state = <char*>_alloc(self.state, self.cap * sizeof(char))
            memset(self.state + old, FREE, self.cap - old)
            self.indexed = <char*>_alloc(self.indexed, self.cap * sizeof(char))
            memset(self.indexed + old, 0, self.cap - old)
            self.pend_pos = <int*>_alloc(self.pend_pos, self.cap * sizeof(int))
            self.pending = <int*>_alloc(self.pending, self.cap * sizeof(int))
            self.out = <int*>_alloc(self.out, self.cap * sizeof(int))
            self.grp = <int*>_alloc(self.grp, self.cap * sizeof(int))
            self.slot_of = <int*>_alloc(self.slot_of, self.cap * sizeof(int))
        self.n_ids += 1
        self._keys.append(None)
        self._subs.append(None)
        return sub

    def add(self, key, subscription, group=None):
        """Store ``subscription`` under ``key``; a key already present raises KeyError.

        ``group`` (a small integer ≥ 0, e.g. the index of a next hop) is what
        :meth:`match_groups` reports for this subscription.
        """
        cdef int i, n, sub
        cdef int g = -1
        cdef Pred* prog
        check_entry(subscription, group)
        if key in self._ids:
            raise KeyError(key)
        if group is not None:
            g = group
            if g >= self.seen_cap:
                self._grow_groups(g)
        if self.n_dead > 64 + self.n_indexed // 2:
            _build(self)
        compiled = []
        ranges = {}
        for p in subscription.predicates:
            aid = _intern_attr(self, p.attr)
            op = _OPCODES[p.op]
            if isinstance(p.value, str):
                compiled.append((aid, op, 0.0, 0.0, _intern_str(self, p.value)))
            elif op == NUM_RANGE:
                lo, hi = _closed_range(p.op, float(p.value))
                if aid in ranges:
                    lo, hi = max(lo, ranges[aid][0]), min(hi, ranges[aid][1])
                ranges[aid] = (lo, hi)
            else:
                compiled.append((aid, op, float(p.value or 0), 0.0, -1))
        compiled.extend((aid, NUM_RANGE, lo, hi, -1) for aid, (lo, hi) in ranges.items())
        compiled.sort()
        n = len(compiled)
        prog = <Pred*>_alloc(NULL, n * sizeof(Pred))
        for i in range(n):
            aid, op, lo, hi, sid = compiled[i]
            prog[i].attr = aid
            prog[i].op = op
            prog[i].lo = lo
            prog[i].hi = hi
            prog[i].sid = sid
            prog[i].s = NULL
            prog[i].slen = 0
            if sid >= 0:
                encoded = self._str_bytes[sid]
                prog[i].s = PyBytes_AS_STRING(encoded)
                prog[i].slen = PyBytes_GET_SIZE(encoded)
        sub = self._new_id()
        self.prog[sub] = prog
        self.prog_len[sub] = n
        self.grp[sub] = g
        if g >= 0:
            self.n_groups += self.grp_live[g] == 0
            self.grp_live[g] += 1
        self.state[sub] = LIVE
        self.indexed[sub] = 0
        self.slot_of[sub] = -1
        self.pend_pos[sub] = self.n_pending
        self.pending[self.n_pending] = sub
        self.n_pending += 1
        self.n_live += 1
        self._ids[key] = sub
        self._keys[sub] = key
        self._subs[sub] = subscription

    def remove(self, key):
        """Forget the subscription stored under ``key``; an unknown key raises KeyError."""
        cdef int sub = self._ids.pop(key)
        cdef int pos, last, slot, g = self.grp[sub]
        _release(self, self._subs[sub])
        if g >= 0:
            self.grp_live[g] -= 1
            self.n_groups -= self.grp_live[g] == 0
        PyMem_Free(self.prog[sub])
        self.prog[sub] = NULL
        self._keys[sub] = None
        self._subs[sub] = None
        self.n_live -= 1
        if self.indexed[sub]:
            self.state[sub] = DEAD
            self.n_dead += 1
            slot = self.slot_of[sub]
            if slot >= 0:
                self.live[slot >> 6] &= ~((<uint64_t>1) << (slot & 63))
        else:
            pos = self.pend_pos[sub]
            last = self.pending[self.n_pending - 1]
            self.pending[pos] = last
            self.pend_pos[last] = pos
            self.n_pending -= 1
            self.state[sub] = FREE
            self._free.append(sub)

    def __len__(self):
        return self.n_live

    def __contains__(self, key):
        return key in self._ids

    def __getitem__(self, key):
        """The subscription stored under ``key``."""
        return self._subs[self._ids[key]]

    def rebuild(self):
        """Build the index now (``match`` otherwise rebuilds it when it falls behind)."""
        _build(self)

    def stats(self):
        """At the last build: subscriptions per cell kind (``equality``, ``prefix``,
        ``postfix``, ``root``) and never matching (``never``), the index's bytes
        (``memory``); rebuilds, pending subscriptions, and the candidates verified so far
        (bits the bitmaps left undecided: a measure of index quality)."""
        return dict(self._stats, subscriptions=self.n_live, pending=self.n_pending,
                    candidates=self.candidates, memory=self.index_bytes)

    cdef int _refresh(self) except -1:
        cdef int base = self.pending_limit + (self.n_indexed - self.n_dead) // 32
        self.pending_work += self.n_pending
        if ((self.n_pending > base and self.pending_work > REBUILD_WORK * (<long long>self.n_indexed))
                or self.n_pending > base + self.n_indexed // 4
                or self.n_dead > 64 + self.n_indexed // 4):
            _build(self)
        return 0

    def match(self, publication):
        """Keys of the subscriptions ``publication`` satisfies, each once, in no set order."""
        if type(publication) is not dict:
            publication = dict(publication)
        self._refresh()
        return _match_one(self, publication)

    @property
    def clock(self):
        """The :class:`MatchClock` this matcher records its matches in, or None."""
        return self._clock

    def match_groups(self, publication):
        """``{group: key}``: every group with a matching subscription, each with one of
        its matching keys (subscriptions added without a group are left out). The search
        stops once every group holding a live subscription has a match."""
        cdef int i, n_out
        cdef dict result = {}
        cdef double started = _now() if self._clock is not None else 0.0
        n_out = self._groups_matching(publication)
        for i in range(n_out):
            _prefetch(_list_item(self._keys, self.out[i]), 1, 3)
        for i in range(n_out):
            result[self.out_grp[i]] = self._keys[self.out[i]]
        if self._clock is not None:
            self._clock._observe(_now() - started)
        return result

    def match_values(self, publication, list values not None):
        """``{values[group]}`` for every group with a matching subscription: the distinct
        next hops of a routing-table part (Algorithm 3's getDistinctSubs) without building
        :meth:`match_groups`' dictionary. ``values`` must hold an item for every group."""
        cdef int i, g, n_out
        cdef set result = set()
        cdef double started = _now() if self._clock is not None else 0.0
        n_out = self._groups_matching(publication)
        for i in range(n_out):
            g = self.out_grp[i]
            if g >= len(values):
                raise IndexError(f"no value for group {g}")
            result.add(<object>_list_item(values, g))
        if self._clock is not None:
            self._clock._observe(_now() - started)
        return result

    cdef int _groups_matching(self, publication) except -1:
        """One matching subscription per group into ``out`` (groups in ``out_grp``);
        returns how many."""
        cdef int i, n_out
        cdef list keep = []
        if type(publication) is not dict:
            publication = dict(publication)
        self._refresh()
        if self.n_groups == 0:
            return 0
        try:
            n_out = _collect(self, publication, keep, True)
        except BaseException:
            memset(self.seen, 0, self.seen_cap)
            raise
        for i in range(n_out):
            self.seen[self.out_grp[i]] = 0
        return n_out

    cdef int _grow_groups(self, int g) except -1:
        """Room for group ids up to ``g`` in ``seen``, ``grp_live`` and ``out_grp``."""
        cdef int old = self.seen_cap
        self.seen_cap = max(64, 2 * (g + 1))
        self.seen = <char*>_alloc(self.seen, self.seen_cap)
        memset(self.seen + old, 0, self.seen_cap - old)
        self.grp_live = <int*>_alloc(self.grp_live, self.seen_cap * sizeof(int))
        memset(self.grp_live + old, 0, (self.seen_cap - old) * sizeof(int))
        self.out_grp = <int*>_alloc(self.out_grp, self.seen_cap * sizeof(int))
        return 0

    def match_many(self, publications):
        """``[self.match(p) for p in publications]``, with the call overhead paid once."""
        self._refresh()
        return [_match_one(self, p if type(p) is dict else dict(p)) for p in publications]


include "_match_index.pxi"
include "_match_columns.pxi"
include "_match_query.pxi"
