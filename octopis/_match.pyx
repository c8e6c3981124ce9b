# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled matcher: an access-predicate index (the design is explained in octopis.matching).

Layout. Each subscription is compiled once, at ``add``, into a small C program of
``Pred`` records sorted by attribute; its ``=``, ``<``, ``<=``, ``>``, ``>=`` predicates on
one attribute merge into one closed interval of doubles. Attribute names and string
constants are interned to dense ids, reference counted and recycled when their last
subscription leaves. A publication is loaded once per match into value slots per
attribute id: ``val[2a]`` holds a's number and ``val[2a + 1]`` its string's id, NaN when
a does not hold that kind, so a residual range or string equality is one NaN-safe test
``lo <= val[slot] <= hi``; kind, epoch and UTF-8 bytes serve the other operators.

Index, rebuilt lazily: every live subscription sits in exactly one access structure,
under its access predicate, with a copy of its *residual* program (the predicates the
access does not decide) stored in the order of the entries, so that verifying the
candidates of one lookup reads memory in order:

* ``eq``, ``str-prefix`` and ``str-postfix`` on attribute a with constant s — entries
  grouped by string id; a publication string v is looked up as itself and, for every
  prefix/postfix length used on a, as its prefix/suffix of that length;
* numeric interval on attribute a — per attribute, the rays [c, inf] sorted by c, the
  rays [-inf, c] sorted by c, and a centred interval tree of the bounded intervals; each
  returns exactly the subscriptions whose interval holds the value, in O(log n + k);
* presence of attribute a (subscriptions with nothing better: ``<>``, ``neq``, string
  ranges, ``str-contains``, ``isPresent``) — entries grouped by attribute id.

Subscriptions added since the last build wait in a pending list and are verified in full.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_Next
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.list cimport PyList_New
from cpython.long cimport PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_CheckExact
from libc.math cimport NAN, isfinite, isnan, nextafter
from libc.limits cimport INT_MAX
from libc.stdint cimport int64_t, uint32_t
from libc.stdlib cimport qsort
from libc.string cimport memcmp, memset

from octopis.filters import Subscription

cdef extern from "Python.h":
    # the list macros on borrowed pointers, to touch each key's refcount once
    PyObject* _list_item "PyList_GET_ITEM"(object, Py_ssize_t)
    void _list_set "PyList_SET_ITEM"(object, Py_ssize_t, PyObject*)
    void _incref "Py_INCREF"(PyObject*)
    void _prefetch "__builtin_prefetch"(const void*, int, int)

cdef double INF = float("inf")
cdef long long MAX_INTEGER = 2 ** 53  # octopis.filters.MAX_INTEGER

# Opcodes of compiled predicates. ``=``, ``<``, ``<=``, ``>``, ``>=`` all compile to
# NUM_RANGE, a closed interval of doubles: ``x < c`` is ``x <= nextafter(c, -inf)``, exact
# for doubles, and all the ranges of a subscription on one attribute merge into one.
cdef enum:
    NUM_RANGE = 0
    NUM_NE = 1
    STR_EQ = 2
    STR_PREFIX = 3
    STR_POSTFIX = 4
    STR_NE = 5
    STR_LT = 6
    STR_LE = 7
    STR_GT = 8
    STR_GE = 9
    STR_CONTAINS = 10
    PRESENT = 11

# Access kinds. The first three are string lookups and equal ``op - STR_EQ``.
cdef enum:
    BY_EQ = 0
    BY_PREFIX = 1
    BY_POSTFIX = 2
    BY_INTERVAL = 3
    BY_PRESENCE = 4
    NEVER = 5

cdef enum:
    KIND_NUM = 1
    KIND_STR = 2

cdef enum:
    FREE = 0
    LIVE = 1
    DEAD = 2

_OPCODES = {
    "=": NUM_RANGE, "<": NUM_RANGE, "<=": NUM_RANGE, ">": NUM_RANGE, ">=": NUM_RANGE,
    "<>": NUM_NE, "eq": STR_EQ, "str-prefix": STR_PREFIX, "str-postfix": STR_POSTFIX,
    "neq": STR_NE, "str-lt": STR_LT, "str-le": STR_LE, "str-gt": STR_GT, "str-ge": STR_GE,
    "str-contains": STR_CONTAINS, "isPresent": PRESENT,
}


cdef struct Pred:
    int attr
    int op
    double lo       # NUM_RANGE: [lo, hi]; NUM_NE: the constant in lo
    double hi
    int sid         # string constants: interned id, UTF-8 bytes and their length
    int slen
    const char* s


cdef struct Rng:
    # a residual range or string equality as a test on one value slot: lo <= val[slot] <= hi
    double lo
    double hi
    int slot


cdef struct Res:
    # an entry's residual program: ``nfast`` tests from index ``fast`` of Matcher.fast, then
    # ``nslow`` predicates from index ``slow`` of Matcher.slow
    int fast
    int nfast
    int slow
    int nslow


cdef struct Ent:
    # a string-lookup entry (key = 3 * attr + kind, grouped by sid) or a presence entry
    # (key = attr)
    int sid
    int key
    int sub
    Res res


cdef struct Bound:
    # one end of an interval in a tree node
    double v
    int sub
    Res res


cdef struct Hot:
    # the arrays a match reads and writes per candidate, copied out of the Matcher so that
    # the compiler keeps them in registers; in group mode (``grp`` not NULL) ``out`` takes
    # one subscription per group (``seen`` marks the groups taken) and the match stops
    # once it holds ``stop`` of them
    const Rng* fast
    const double* val
    const char* state
    int* out
    const int* grp
    char* seen
    int stop


cdef struct Node:
    double center
    int left
    int right
    int beg
    int end


cdef struct Ival:
    double lo
    double hi
    double point
    int attr
    int sub


cdef struct NumStat:
    int attr
    double v


cdef void* _alloc(void* p, size_t n) except NULL:
    cdef void* q = PyMem_Realloc(p, n if n > 0 else 1)
    if q == NULL:
        raise MemoryError()
    return q


cdef int _cmp_double(const void* x, const void* y) noexcept nogil:
    cdef double a = (<const double*>x)[0]
    cdef double b = (<const double*>y)[0]
    return (a > b) - (a < b)


cdef int _cmp_int64(const void* x, const void* y) noexcept nogil:
    cdef int64_t a = (<const int64_t*>x)[0]
    cdef int64_t b = (<const int64_t*>y)[0]
    return (a > b) - (a < b)


cdef int _cmp_ent(const void* x, const void* y) noexcept nogil:
    cdef const Ent* p = <const Ent*>x
    cdef const Ent* q = <const Ent*>y
    if p.sid != q.sid:
        return (p.sid > q.sid) - (p.sid < q.sid)
    if p.key != q.key:
        return (p.key > q.key) - (p.key < q.key)
    return (p.sub > q.sub) - (p.sub < q.sub)


cdef int _cmp_numstat(const void* x, const void* y) noexcept nogil:
    cdef const NumStat* p = <const NumStat*>x
    cdef const NumStat* q = <const NumStat*>y
    if p.attr != q.attr:
        return (p.attr > q.attr) - (p.attr < q.attr)
    return (p.v > q.v) - (p.v < q.v)


cdef int _cmp_ival(const void* x, const void* y) noexcept nogil:
    cdef const Ival* p = <const Ival*>x
    cdef const Ival* q = <const Ival*>y
    if p.attr != q.attr:
        return (p.attr > q.attr) - (p.attr < q.attr)
    return (p.sub > q.sub) - (p.sub < q.sub)


cdef int _cmp_by_lo(const void* x, const void* y) noexcept nogil:
    cdef const Bound* p = <const Bound*>x
    cdef const Bound* q = <const Bound*>y
    if p.v != q.v:
        return (p.v > q.v) - (p.v < q.v)
    return (p.sub > q.sub) - (p.sub < q.sub)


cdef int _cmp_by_hi(const void* x, const void* y) noexcept nogil:
    cdef const Bound* p = <const Bound*>x
    cdef const Bound* q = <const Bound*>y
    if p.v != q.v:
        return (p.v < q.v) - (p.v > q.v)
    return (p.sub > q.sub) - (p.sub < q.sub)


cdef inline int _lower(const double* a, int n, double x) noexcept nogil:
    """First index i with a[i] >= x."""
    cdef int lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline int _upper(const double* a, int n, double x) noexcept nogil:
    """First index i with a[i] > x."""
    cdef int lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline int _count(const int64_t* a, int n, int64_t x) noexcept nogil:
    """How many times x occurs in the sorted array a."""
    cdef int lo = 0, hi = n, mid, first
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    first = lo
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo - first


cdef inline bint _same(const char* a, const char* b, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        if a[i] != b[i]:
            return False
    return True


cdef inline int _strcmp(const char* a, Py_ssize_t la, const char* b, Py_ssize_t lb) noexcept nogil:
    cdef int c = memcmp(a, b, la if la < lb else lb)
    if c != 0:
        return c
    return (la > lb) - (la < lb)


cdef inline bint _contains(const char* a, Py_ssize_t la, const char* b, Py_ssize_t lb) noexcept nogil:
    cdef Py_ssize_t i
    if lb == 0:
        return True
    for i in range(la - lb + 1):
        if a[i] == b[0] and memcmp(a + i, b, lb) == 0:
            return True
    return False


cdef inline double _share(const double* vals, int n, double lo, double hi) noexcept nogil:
    """The fraction of the sorted ``vals`` inside [lo, hi]."""
    cdef int first, last
    if n == 0:
        return 1.0
    first = _lower(vals, n, lo)
    last = _upper(vals, n, hi)
    return (last - first) / <double>n if last > first else 0.0


def is_plain_publication(object publication, set known):
    """Whether ``publication`` is a non-empty dict whose names are all in ``known`` and
    whose values are strings, finite floats or integers within ±2**53 (never ``bool``):
    the common case of :func:`octopis.filters.validate_publication`, decided in C on every
    hop. False means "not known to be valid": the Python check then decides and words
    the error."""
    cdef PyObject* name
    cdef PyObject* value
    cdef Py_ssize_t pos = 0
    cdef int overflow
    cdef long long number
    if type(publication) is not dict or not publication:
        return False
    while PyDict_Next(publication, &pos, &name, &value):
        if not PyUnicode_CheckExact(<object>name) or <object>name not in known:
            return False
        if PyUnicode_CheckExact(<object>value):
            continue
        if PyFloat_CheckExact(<object>value):
            if isfinite(PyFloat_AS_DOUBLE(<object>value)):
                continue
            return False
        if not PyLong_CheckExact(<object>value):
            return False
        number = PyLong_AsLongLongAndOverflow(<object>value, &overflow)
        if overflow or number > MAX_INTEGER or number < -MAX_INTEGER:
            return False
    return True


cdef inline int _take(Hot h, int sub, bint ok, int n_out) noexcept:
    """Append ``sub`` to ``h.out`` if it matched (``ok``) and, in group mode, if its group
    has no subscription there yet; returns the new length."""
    cdef int g
    if h.grp == NULL:
        h.out[n_out] = sub  # branch-free: written always, kept if ok
        return n_out + ok
    if not ok:
        return n_out
    g = h.grp[sub]
    if g < 0 or h.seen[g]:
        return n_out
    h.seen[g] = 1
    h.out[n_out] = sub
    return n_out + 1


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


cdef class Matcher:
    """Compiled matcher; the API and the semantics are those of ``ReferenceMatcher``.

    ``pending_limit`` bounds how many subscriptions added since the last build are
    verified one by one before ``match`` rebuilds the index (the bound grows by 1/32 of
    the indexed subscriptions, so rebuilding costs O(log n) amortised per ``add``).
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
    cdef int* out
    # optional group of each subscription (-1: none) and the scratch marks of match_groups
    cdef int* grp
    cdef char* seen
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
    # the index
    cdef int built_attrs, built_strs
    cdef Rng* fast
    cdef Pred* slow
    cdef int* str_off
    cdef Ent* str_ent
    cdef char* affixed
    cdef dict _affix_lengths
    cdef int* iv_root
    cdef Node* nodes
    cdef Bound* by_lo
    cdef Bound* by_hi
    cdef int* pr_off
    cdef Ent* pr_ent
    cdef long long candidates
    cdef dict _stats

    def __cinit__(self, *, int pending_limit=64):
        self._ids = {}
        self._keys = []
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
        self._affix_lengths = {}
        self.pending_limit = max(0, pending_limit)
        self.epoch = 1
        self._stats = {"rebuilds": 0, "equality": 0, "prefix": 0, "postfix": 0,
                       "interval": 0, "presence": 0, "never": 0}

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
        PyMem_Free(self.seen)
        PyMem_Free(self.grp_live)
        PyMem_Free(self.val)
        PyMem_Free(self.v_epoch)
        PyMem_Free(self.v_kind)
        PyMem_Free(self.v_sid)
        PyMem_Free(<void*>self.v_str)
        PyMem_Free(self.v_len)
        PyMem_Free(self.v_obj)
        PyMem_Free(self.touched)
        self._free_index()

    cdef void _free_index(self) noexcept:
        PyMem_Free(self.fast)
        PyMem_Free(self.slow)
        PyMem_Free(self.str_off)
        PyMem_Free(self.str_ent)
        PyMem_Free(self.affixed)
        PyMem_Free(self.iv_root)
        PyMem_Free(self.nodes)
        PyMem_Free(self.by_lo)
        PyMem_Free(self.by_hi)
        PyMem_Free(self.pr_off)
        PyMem_Free(self.pr_ent)
        self.fast = NULL
        self.slow = NULL
        self.str_off = NULL
        self.str_ent = NULL
        self.affixed = NULL
        self.iv_root = NULL
        self.nodes = NULL
        self.by_lo = NULL
        self.by_hi = NULL
        self.pr_off = NULL
        self.pr_ent = NULL
        self.built_attrs = 0
        self.built_strs = 0
        self._affix_lengths = {}

    # ---- interning -------------------------------------------------------------------

    cdef int _intern_attr(self, str name) except -1:
        cdef int aid, old, i
        found = self._attr_ids.get(name)
        if found is not None:
            aid = found
            self._attr_refs[aid] += 1
            return aid
        if self._free_attrs:
            aid = self._free_attrs.pop()
            self._attr_refs[aid] = 1
        else:
            aid = len(self._attr_refs)
            self._attr_refs.append(1)
        self._attr_ids[name] = aid
        if aid >= self.acap:
            old = self.acap
            self.acap = max(16, 2 * self.acap)
            self.val = <double*>_alloc(self.val, 2 * self.acap * sizeof(double))
            for i in range(2 * old, 2 * self.acap):
                self.val[i] = NAN
            self.v_epoch = <uint32_t*>_alloc(self.v_epoch, self.acap * sizeof(uint32_t))
            memset(self.v_epoch + old, 0, (self.acap - old) * sizeof(uint32_t))
            self.v_kind = <char*>_alloc(self.v_kind, self.acap * sizeof(char))
            memset(self.v_kind + old, 0, self.acap - old)
            self.v_sid = <int*>_alloc(self.v_sid, self.acap * sizeof(int))
            memset(self.v_sid + old, 0, (self.acap - old) * sizeof(int))
            self.v_str = <const char**>_alloc(<void*>self.v_str, self.acap * sizeof(char*))
            self.v_len = <Py_ssize_t*>_alloc(self.v_len, self.acap * sizeof(Py_ssize_t))
            self.v_obj = <PyObject**>_alloc(self.v_obj, self.acap * sizeof(PyObject*))
            self.touched = <int*>_alloc(self.touched, self.acap * sizeof(int))
        return aid

    cdef int _intern_str(self, str value) except -1:
        cdef int sid
        found = self._str_ids.get(value)
        if found is not None:
            sid = found
            self._str_refs[sid] += 1
            return sid
        encoded = value.encode("utf-8", "surrogatepass")
        if self._free_strs:
            sid = self._free_strs.pop()
            self._str_refs[sid] = 1
            self._str_text[sid] = value
            self._str_bytes[sid] = encoded
        else:
            sid = len(self._str_refs)
            self._str_refs.append(1)
            self._str_text.append(value)
            self._str_bytes.append(encoded)
        self._str_ids[value] = sid
        return sid

    cdef int _release(self, object subscription) except -1:
        cdef int aid, sid
        for p in subscription.predicates:
            aid = self._attr_ids[p.attr]
            self._attr_refs[aid] -= 1
            if self._attr_refs[aid] == 0:
                del self._attr_ids[p.attr]
                self._free_attrs.append(aid)
            if isinstance(p.value, str):
                sid = self._str_ids[p.value]
                self._str_refs[sid] -= 1
                if self._str_refs[sid] == 0:
                    del self._str_ids[p.value]
                    self._str_text[sid] = None
                    self._str_bytes[sid] = None
                    self._free_strs.append(sid)
        return 0

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
        if not isinstance(subscription, Subscription):
            raise TypeError(f"expected a Subscription, got {type(subscription).__name__}")
        if key in self._ids:
            raise KeyError(key)
        if group is not None:
            if type(group) is not int or not 0 <= group < 1 << 30:
                raise ValueError(f"group must be an integer in [0, 2**30), got {group!r}")
            g = group
            if g >= self.seen_cap:
                self._grow_groups(g)
        if self.n_dead > 64 + self.n_indexed // 2:
            self._build()
        compiled = []
        ranges = {}
        for p in subscription.predicates:
            aid = self._intern_attr(p.attr)
            op = _OPCODES[p.op]
            if isinstance(p.value, str):
                compiled.append((aid, op, 0.0, 0.0, self._intern_str(p.value)))
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
        cdef int pos, last, g = self.grp[sub]
        self._release(self._subs[sub])
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
        self._build()

    def stats(self):
        """Subscriptions per access structure at the last build, rebuilds, pending
        subscriptions, and candidates verified so far (a measure of index quality)."""
        return dict(self._stats, subscriptions=self.n_live, pending=self.n_pending,
                    candidates=self.candidates)

    # ---- index construction ----------------------------------------------------------

    cdef int _build(self) except -1:
        cdef int i, j, n, a, sub, n_str, n_iv, n_pr, n_mres, n_num, n_keys, n_nodes
        cdef int n_fast = 0, n_slow = 0, n_up, n_down, k, node
        cdef int best, best_at, kind, end, beg, total = 0, n_never = 0
        cdef int n_attrs = len(self._attr_refs)
        cdef int n_strs = len(self._str_refs)
        cdef double best_est, est
        cdef char has_num, has_str, has_range
        cdef double v
        cdef Pred* p
        cdef Pred* q
        cdef Ival cur
        cdef NumStat* nums = NULL
        cdef int* num_off = NULL
        cdef double* num_vals = NULL
        cdef int64_t* keys = NULL
        cdef int* key_total = NULL
        cdef Pred* mres = NULL
        cdef double* mres_est = NULL
        cdef int* mres_beg = NULL
        cdef int* mres_len = NULL
        cdef Ent* str_tmp = NULL
        cdef Ent* pr_tmp = NULL
        cdef Ival* ivs = NULL
        cdef Ival* iv_tmp = NULL
        cdef double* pts = NULL

        self._free_index()
        for sub in range(self.n_ids):
            if self.state[sub] == DEAD:
                self.state[sub] = FREE
                self._free.append(sub)
            elif self.state[sub] == LIVE:
                total += self.prog_len[sub]
        try:
            # The constants of all subscriptions stand for the values of each attribute:
            # numeric constants per attribute (sorted), string keys (3·attr + kind, sid).
            nums = <NumStat*>_alloc(NULL, 2 * total * sizeof(NumStat))
            keys = <int64_t*>_alloc(NULL, total * sizeof(int64_t))
            key_total = <int*>_alloc(NULL, 3 * n_attrs * sizeof(int))
            memset(key_total, 0, 3 * n_attrs * sizeof(int))
            n_num = n_keys = 0
            for sub in range(self.n_ids):
                if self.state[sub] != LIVE:
                    continue
                p = self.prog[sub]
                for i in range(self.prog_len[sub]):
                    if p[i].op <= NUM_NE:
                        for j in range(2 if p[i].op == NUM_RANGE else 1):
                            v = p[i].hi if j else p[i].lo
                            if -INF < v < INF:
                                nums[n_num].attr = p[i].attr
                                nums[n_num].v = v
                                n_num += 1
                    elif p[i].op <= STR_POSTFIX:
                        j = 3 * p[i].attr + p[i].op - STR_EQ
                        keys[n_keys] = ((<int64_t>j) << 32) | p[i].sid
                        key_total[j] += 1
                        n_keys += 1
            qsort(nums, n_num, sizeof(NumStat), _cmp_numstat)
            qsort(keys, n_keys, sizeof(int64_t), _cmp_int64)
            num_off = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
            num_vals = <double*>_alloc(NULL, n_num * sizeof(double))
            memset(num_off, 0, (n_attrs + 1) * sizeof(int))
            for i in range(n_num):
                num_off[nums[i].attr + 1] += 1
                num_vals[i] = nums[i].v
            for a in range(n_attrs):
                num_off[a + 1] += num_off[a]

            # Access predicate and residual program (in mres) of every live subscription.
            mres = <Pred*>_alloc(NULL, total * sizeof(Pred))
            mres_est = <double*>_alloc(NULL, total * sizeof(double))
            mres_beg = <int*>_alloc(NULL, self.n_ids * sizeof(int))
            mres_len = <int*>_alloc(NULL, self.n_ids * sizeof(int))
            str_tmp = <Ent*>_alloc(NULL, self.n_live * sizeof(Ent))
            pr_tmp = <Ent*>_alloc(NULL, self.n_live * sizeof(Ent))
            ivs = <Ival*>_alloc(NULL, self.n_live * sizeof(Ival))
            n_str = n_iv = n_pr = n_mres = 0
            for sub in range(self.n_ids):
                self.indexed[sub] = self.state[sub] == LIVE
                if self.state[sub] != LIVE:
                    continue
                p = self.prog[sub]
                n = self.prog_len[sub]
                best = BY_PRESENCE
                best_at = 0
                best_est = 1.0
                i = 0
                while i < n:
                    a = p[i].attr
                    has_num = has_str = has_range = 0
                    end = i
                    while end < n and p[end].attr == a:
                        q = &p[end]
                        if q.op <= NUM_NE:
                            has_num = 1
                            if q.op == NUM_RANGE:
                                has_range = 1
                                cur.lo = q.lo
                                cur.hi = q.hi
                        elif q.op < PRESENT:
                            has_str = 1
                            if q.op <= STR_POSTFIX:
                                est = self._estimate(q, num_off, num_vals, keys, n_keys,
                                                     key_total)
                                if est < best_est or (est == best_est and best == BY_PRESENCE):
                                    best, best_at, best_est = q.op - STR_EQ, end, est
                        end += 1
                    if (has_num and has_str) or (has_range and not cur.lo <= cur.hi):
                        best = NEVER
                        break
                    if has_range:
                        cur.point = cur.lo if cur.lo > -INF else (cur.hi if cur.hi < INF else 0.0)
                        est = _share(num_vals + num_off[a], num_off[a + 1] - num_off[a],
                                     cur.lo, cur.hi)
                        if est < best_est or (est == best_est and best == BY_PRESENCE):
                            best, best_at, best_est = BY_INTERVAL, i, est
                            ivs[n_iv] = cur
                            ivs[n_iv].attr = a
                            ivs[n_iv].sub = sub
                    i = end
                if best == NEVER:
                    n_never += 1
                    continue
                a = p[best_at].attr
                mres_beg[sub] = n_mres
                for i in range(n):
                    q = &p[i]
                    if (i == best_at and best <= BY_POSTFIX) or (
                            q.attr == a and ((best == BY_INTERVAL and q.op == NUM_RANGE)
                                             or (best == BY_PRESENCE and q.op == PRESENT))):
                        continue
                    est = self._estimate(q, num_off, num_vals, keys, n_keys, key_total)
                    j = n_mres
                    while j > mres_beg[sub] and mres_est[j - 1] > est:
                        mres[j] = mres[j - 1]
                        mres_est[j] = mres_est[j - 1]
                        j -= 1
                    mres[j] = q[0]
                    mres_est[j] = est
                    n_mres += 1
                mres_len[sub] = n_mres - mres_beg[sub]
                if best <= BY_POSTFIX:
                    str_tmp[n_str].sid = p[best_at].sid
                    str_tmp[n_str].key = 3 * a + best
                    str_tmp[n_str].sub = sub
                    n_str += 1
                elif best == BY_INTERVAL:
                    n_iv += 1
                else:
                    pr_tmp[n_pr].sid = 0
                    pr_tmp[n_pr].key = a
                    pr_tmp[n_pr].sub = sub
                    n_pr += 1

            # Residual copies: one per string or presence entry, two per interval.
            self.fast = <Rng*>_alloc(NULL, (n_mres + 1) * 2 * sizeof(Rng))
            self.slow = <Pred*>_alloc(NULL, (n_mres + 1) * 2 * sizeof(Pred))

            # String lookups: entries grouped by sid, then key.
            qsort(str_tmp, n_str, sizeof(Ent), _cmp_ent)
            self.str_off = <int*>_alloc(NULL, (n_strs + 1) * sizeof(int))
            memset(self.str_off, 0, (n_strs + 1) * sizeof(int))
            self.affixed = <char*>_alloc(NULL, n_attrs * sizeof(char))
            memset(self.affixed, 0, n_attrs)
            counts = [0, 0, 0]
            affixes = {}
            for i in range(n_str):
                self.str_off[str_tmp[i].sid + 1] += 1
                self._place(&str_tmp[i].res, str_tmp[i].sub, mres, mres_beg, mres_len,
                            &n_fast, &n_slow)
                kind = str_tmp[i].key % 3
                counts[kind] += 1
                if kind != BY_EQ:
                    a = str_tmp[i].key // 3
                    self.affixed[a] = 1
                    affixes.setdefault((a, kind), set()).add(len(self._str_text[str_tmp[i].sid]))
            for i in range(n_strs):
                self.str_off[i + 1] += self.str_off[i]
            self.str_ent = str_tmp
            str_tmp = NULL
            for (a, kind), lengths in affixes.items():
                prefixes, postfixes = self._affix_lengths.get(a, ((), ()))
                if kind == BY_PREFIX:
                    prefixes = tuple(sorted(lengths))
                else:
                    postfixes = tuple(sorted(lengths))
                self._affix_lengths[a] = (prefixes, postfixes)

            # Presence: entries grouped by attribute.
            qsort(pr_tmp, n_pr, sizeof(Ent), _cmp_ent)
            self.pr_off = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
            memset(self.pr_off, 0, (n_attrs + 1) * sizeof(int))
            for i in range(n_pr):
                self.pr_off[pr_tmp[i].key + 1] += 1
                self._place(&pr_tmp[i].res, pr_tmp[i].sub, mres, mres_beg, mres_len,
                            &n_fast, &n_slow)
            for i in range(n_attrs):
                self.pr_off[i + 1] += self.pr_off[i]
            self.pr_ent = pr_tmp
            pr_tmp = NULL

            # Intervals: per attribute, the rays [c, inf] in a node centred at +inf, whose
            # left child holds the rays [-inf, c] centred at -inf, whose right child is a
            # centred interval tree of the bounded intervals.
            qsort(ivs, n_iv, sizeof(Ival), _cmp_ival)
            self.iv_root = <int*>_alloc(NULL, n_attrs * sizeof(int))
            for a in range(n_attrs):
                self.iv_root[a] = -1
            self.nodes = <Node*>_alloc(NULL, n_iv * sizeof(Node))
            self.by_lo = <Bound*>_alloc(NULL, n_iv * sizeof(Bound))
            self.by_hi = <Bound*>_alloc(NULL, n_iv * sizeof(Bound))
            iv_tmp = <Ival*>_alloc(NULL, n_iv * sizeof(Ival))
            pts = <double*>_alloc(NULL, n_iv * sizeof(double))
            n_nodes = 0
            beg = 0
            i = 0
            while i < n_iv:
                j = i
                n_up = n_down = 0
                while j < n_iv and ivs[j].attr == ivs[i].attr:
                    j += 1
                for k in range(i, j):
                    if ivs[k].hi == INF:
                        cur = ivs[k]
                        ivs[k] = ivs[i + n_up]
                        ivs[i + n_up] = cur
                        n_up += 1
                for k in range(i + n_up, j):
                    if ivs[k].lo == -INF:
                        cur = ivs[k]
                        ivs[k] = ivs[i + n_up + n_down]
                        ivs[i + n_up + n_down] = cur
                        n_down += 1
                node = self._tree(ivs + i + n_up + n_down, j - i - n_up - n_down, iv_tmp,
                                  pts, &n_nodes, &beg)
                if n_down:
                    node = self._node(ivs + i + n_up, n_down, -INF, -1, node, &n_nodes, &beg)
                if n_up:
                    node = self._node(ivs + i, n_up, INF, node, -1, &n_nodes, &beg)
                self.iv_root[ivs[i].attr] = node
                i = j
            for i in range(n_iv):
                self._place(&self.by_lo[i].res, self.by_lo[i].sub, mres, mres_beg, mres_len,
                            &n_fast, &n_slow)
                self._place(&self.by_hi[i].res, self.by_hi[i].sub, mres, mres_beg, mres_len,
                            &n_fast, &n_slow)

            self.built_attrs = n_attrs
            self.built_strs = n_strs
            self.n_pending = 0
            self.n_indexed = self.n_live
            self.n_dead = 0
            self._stats.update(
                rebuilds=self._stats["rebuilds"] + 1, equality=counts[0], prefix=counts[1],
                postfix=counts[2], interval=n_iv, presence=n_pr, never=n_never)
        except BaseException:
            self._free_index()
            self.n_pending = self.n_indexed = self.n_dead = 0
            for sub in range(self.n_ids):
                self.indexed[sub] = 0
                if self.state[sub] == LIVE:
                    self.pend_pos[sub] = self.n_pending
                    self.pending[self.n_pending] = sub
                    self.n_pending += 1
            raise
        finally:
            PyMem_Free(nums)
            PyMem_Free(num_off)
            PyMem_Free(num_vals)
            PyMem_Free(keys)
            PyMem_Free(key_total)
            PyMem_Free(mres)
            PyMem_Free(mres_est)
            PyMem_Free(mres_beg)
            PyMem_Free(mres_len)
            PyMem_Free(str_tmp)
            PyMem_Free(pr_tmp)
            PyMem_Free(ivs)
            PyMem_Free(iv_tmp)
            PyMem_Free(pts)
        return 0

    cdef void _place(self, Res* r, int sub, const Pred* mres, const int* beg,
                     const int* length, int* n_fast, int* n_slow) noexcept:
        """Copy the residual program of ``sub`` to the ends of ``fast`` and ``slow``."""
        cdef int i
        cdef const Pred* q
        cdef Rng* f
        r.fast = n_fast[0]
        r.slow = n_slow[0]
        for i in range(beg[sub], beg[sub] + length[sub]):
            q = &mres[i]
            if q.op == NUM_RANGE or q.op == STR_EQ:
                f = &self.fast[n_fast[0]]
                f.slot = 2 * q.attr + (q.op == STR_EQ)
                f.lo = q.lo if q.op == NUM_RANGE else q.sid
                f.hi = q.hi if q.op == NUM_RANGE else q.sid
                n_fast[0] += 1
            else:
                self.slow[n_slow[0]] = q[0]
                n_slow[0] += 1
        r.nfast = n_fast[0] - r.fast
        r.nslow = n_slow[0] - r.slow

    cdef double _estimate(self, const Pred* q, const int* num_off, const double* num_vals,
                          const int64_t* keys, int n_keys, const int* key_total) noexcept:
        """Estimated selectivity of one predicate under the constants' distribution."""
        cdef int j
        if q.op == NUM_RANGE:
            return _share(num_vals + num_off[q.attr], num_off[q.attr + 1] - num_off[q.attr],
                          q.lo, q.hi)
        if q.op <= STR_POSTFIX:
            j = 3 * q.attr + q.op - STR_EQ
            return _count(keys, n_keys, ((<int64_t>j) << 32) | q.sid) / <double>key_total[j]
        if q.op == NUM_NE or q.op == STR_NE or q.op == PRESENT:
            return 1.0
        return 0.5

    cdef int _node(self, const Ival* mid, int n, double center, int left, int right,
                   int* n_nodes, int* n_bounds) noexcept:
        """Add a node holding the intervals ``mid`` (all contain ``center``)."""
        cdef int i, node = n_nodes[0], beg = n_bounds[0]
        for i in range(n):
            self.by_lo[beg + i].v = mid[i].lo
            self.by_lo[beg + i].sub = mid[i].sub
            self.by_hi[beg + i].v = mid[i].hi
            self.by_hi[beg + i].sub = mid[i].sub
        qsort(self.by_lo + beg, n, sizeof(Bound), _cmp_by_lo)
        qsort(self.by_hi + beg, n, sizeof(Bound), _cmp_by_hi)
        n_bounds[0] += n
        n_nodes[0] += 1
        self.nodes[node].center = center
        self.nodes[node].beg = beg
        self.nodes[node].end = beg + n
        self.nodes[node].left = left
        self.nodes[node].right = right
        return node

    cdef int _tree(self, Ival* items, int n, Ival* tmp, double* pts,
                   int* n_nodes, int* n_bounds) noexcept:
        """Build a centred interval tree over ``items``; returns its root node (or -1).

        The centre is the median of points inside the intervals, so each side holds at
        most half of them and the depth stays logarithmic.
        """
        cdef int i, nl = 0, nm = 0, nr = 0, node, left, right
        cdef double center
        cdef Ival* iv
        if n == 0:
            return -1
        for i in range(n):
            pts[i] = items[i].point
        qsort(pts, n, sizeof(double), _cmp_double)
        center = pts[n // 2]
        for i in range(n):
            iv = &items[i]
            if iv.hi < center:
                tmp[nl] = iv[0]
                nl += 1
            elif iv.lo > center:
                nr += 1
                tmp[n - nr] = iv[0]
            else:
                items[nm] = iv[0]
                nm += 1
        node = self._node(items, nm, center, -1, -1, n_nodes, n_bounds)
        for i in range(nl):
            items[i] = tmp[i]
        for i in range(nr):
            items[nl + i] = tmp[n - 1 - i]
        left = self._tree(items, nl, tmp, pts, n_nodes, n_bounds)
        right = self._tree(items + nl, nr, tmp, pts, n_nodes, n_bounds)
        self.nodes[node].left = left
        self.nodes[node].right = right
        return node

    # ---- matching --------------------------------------------------------------------

    cdef int _load(self, dict publication, list keep) except -1:
        """Clear the slots of the previous publication and fill them from this one; the
        attributes that count (known, of a supported type) end up in ``touched``."""
        cdef int t, aid
        cdef char kind
        cdef PyObject* found
        cdef Py_ssize_t size
        cdef const char* data
        cdef double num = 0.0
        for t in range(self.n_loaded):
            aid = self.touched[t]
            self.val[2 * aid] = NAN
            self.val[2 * aid + 1] = NAN
        self.n_loaded = 0
        self.epoch += 1
        if self.epoch == 0:
            if self.acap > 0:
                memset(self.v_epoch, 0, self.acap * sizeof(uint32_t))
            self.epoch = 1
        for attr, value in publication.items():
            found = PyDict_GetItemWithError(self._attr_ids, attr)
            if found == NULL:
                continue
            aid = <int>(<object>found)
            if PyFloat_CheckExact(value):
                kind = KIND_NUM
                num = PyFloat_AS_DOUBLE(value)
            elif PyUnicode_CheckExact(value) or isinstance(value, str):
                kind = KIND_STR
            elif PyLong_CheckExact(value) or (isinstance(value, (int, float))
                                              and not isinstance(value, bool)):
                kind = KIND_NUM
                try:
                    num = value
                except OverflowError:
                    num = INF if value > 0 else -INF
            else:
                continue
            # registered before any slot is written, so that the next load clears it
            self.touched[self.n_loaded] = aid
            self.n_loaded += 1
            self.v_epoch[aid] = self.epoch
            self.v_kind[aid] = kind
            if kind == KIND_NUM:
                self.val[2 * aid] = num
                continue
            found = PyDict_GetItemWithError(self._str_ids, value)
            self.v_sid[aid] = -1 if found == NULL else <int>(<object>found)
            self.val[2 * aid + 1] = self.v_sid[aid]
            try:
                data = PyUnicode_AsUTF8AndSize(value, &size)
            except UnicodeEncodeError:
                encoded = (<str>value).encode("utf-8", "surrogatepass")
                keep.append(encoded)
                data = PyBytes_AS_STRING(encoded)
                size = PyBytes_GET_SIZE(encoded)
            self.v_str[aid] = data
            self.v_len[aid] = size
            self.v_obj[aid] = <PyObject*>value
        return self.n_loaded

    cdef inline bint _holds(self, const Pred* p, int n) noexcept:
        """Whether the loaded publication satisfies all ``n`` predicates at ``p``."""
        cdef int i, a
        cdef bint ok = True
        cdef double x
        for i in range(n):
            a = p[i].attr
            if p[i].op == NUM_RANGE:
                x = self.val[2 * a]
                ok &= (p[i].lo <= x) & (x <= p[i].hi)
            elif p[i].op == STR_EQ:
                ok &= self.val[2 * a + 1] == p[i].sid
            elif not self._holds_other(&p[i]):
                return False
        return ok

    cdef bint _holds_other(self, const Pred* p) noexcept:
        """One predicate that is neither a range nor a string equality."""
        cdef int a = p.attr, op = p.op, c
        cdef Py_ssize_t la
        cdef const char* s
        if self.v_epoch[a] != self.epoch:
            return False
        if op == PRESENT:
            return True
        if op == NUM_NE:
            return self.v_kind[a] == KIND_NUM and self.val[2 * a] != p.lo
        if self.v_kind[a] != KIND_STR:
            return False
        if op == STR_NE:
            return self.v_sid[a] != p.sid
        s = self.v_str[a]
        la = self.v_len[a]
        if op == STR_PREFIX:
            return la >= p.slen and _same(s, p.s, p.slen)
        if op == STR_POSTFIX:
            return la >= p.slen and _same(s + la - p.slen, p.s, p.slen)
        if op == STR_CONTAINS:
            return _contains(s, la, p.s, p.slen)
        c = _strcmp(s, la, p.s, p.slen)
        if op == STR_LT:
            return c < 0
        if op == STR_LE:
            return c <= 0
        if op == STR_GT:
            return c > 0
        return c >= 0

    cdef inline int _emit(self, Hot h, int sub, const Res* r, int n_out) noexcept:
        """Verify one candidate against its residual program; append it to ``out`` if it
        matches. The range tests, nearly all of a residual, do not branch on outcomes."""
        cdef int i
        cdef bint ok = True
        cdef double x
        cdef const Rng* f
        if h.state[sub] != LIVE:
            return n_out
        for i in range(r.fast, r.fast + r.nfast):
            f = &h.fast[i]
            x = h.val[f.slot]
            ok &= (f.lo <= x) & (x <= f.hi)
        if r.nslow and ok:
            ok = self._holds(self.slow + r.slow, r.nslow)
        return _take(h, sub, ok, n_out)

    cdef inline int _lookup(self, Hot h, int sid, int key, int n_out) noexcept:
        """Candidates of the string lookup (sid, key)."""
        cdef int j, end, first
        cdef const Ent* e
        if sid < 0 or sid >= self.built_strs:
            return n_out
        j = self.str_off[sid]
        end = self.str_off[sid + 1]
        while j < end and self.str_ent[j].key < key:
            j += 1
        first = j
        while j < end and self.str_ent[j].key == key and n_out < h.stop:
            e = &self.str_ent[j]
            n_out = self._emit(h, e.sub, &e.res, n_out)
            j += 1
        self.candidates += j - first
        return n_out

    cdef int _affix_lookups(self, Hot h, int a, int n_out) except -1:
        """Candidates of the prefix and postfix lookups of string attribute ``a``."""
        cdef Py_ssize_t length
        cdef int size
        cdef PyObject* found
        value = <str>self.v_obj[a]
        length = len(value)
        prefixes, postfixes = self._affix_lengths[a]
        for size in prefixes:
            if size > length:
                break
            found = PyDict_GetItemWithError(self._str_ids, value[:size])
            if found != NULL:
                n_out = self._lookup(h, <int>(<object>found), 3 * a + BY_PREFIX, n_out)
        for size in postfixes:
            if size > length:
                break
            found = PyDict_GetItemWithError(self._str_ids, value[length - size:])
            if found != NULL:
                n_out = self._lookup(h, <int>(<object>found), 3 * a + BY_POSTFIX, n_out)
        return n_out

    cdef int _collect(self, dict publication, list keep, bint groups) except -1:
        """Internal ids of the matching subscriptions into ``self.out``; returns how many.
        ``keep`` holds the publication's values alive while ``out`` is in use.

        With ``groups``, ``out`` gets one matching subscription per group instead, with
        its group marked in ``seen``, and the search stops as soon as every group with a
        live subscription has one (Algorithm 3 needs distinct next hops, not every match).
        """
        cdef int n_touched, t, a, i, end, node, n_out = 0
        cdef long long n_cand = 0
        cdef double v
        cdef const Node* nd
        cdef const Bound* bounds
        cdef Hot h
        n_touched = self._load(publication, keep)
        h.fast = self.fast
        h.val = self.val
        h.state = self.state
        h.out = self.out
        h.grp = self.grp if groups else NULL
        h.seen = self.seen
        h.stop = self.n_groups if groups else INT_MAX
        for t in range(n_touched):
            a = self.touched[t]
            if a >= self.built_attrs:
                continue
            if self.v_kind[a] == KIND_NUM:
                v = h.val[2 * a]
                node = -1 if isnan(v) else self.iv_root[a]
                while node >= 0 and n_out < h.stop:
                    nd = &self.nodes[node]
                    i = nd.beg
                    if v < nd.center:
                        bounds = self.by_lo
                        while i < nd.end and bounds[i].v <= v and n_out < h.stop:
                            n_out = self._emit(h, bounds[i].sub, &bounds[i].res, n_out)
                            i += 1
                        node = nd.left
                    elif v > nd.center:
                        bounds = self.by_hi
                        while i < nd.end and bounds[i].v >= v and n_out < h.stop:
                            n_out = self._emit(h, bounds[i].sub, &bounds[i].res, n_out)
                            i += 1
                        node = nd.right
                    else:
                        bounds = self.by_lo
                        while i < nd.end and n_out < h.stop:
                            n_out = self._emit(h, bounds[i].sub, &bounds[i].res, n_out)
                            i += 1
                        node = -1
                    n_cand += i - nd.beg
            else:
                n_out = self._lookup(h, self.v_sid[a], 3 * a + BY_EQ, n_out)
                if self.affixed[a]:
                    n_out = self._affix_lookups(h, a, n_out)
            end = self.pr_off[a + 1]
            i = self.pr_off[a]
            while i < end and n_out < h.stop:
                n_out = self._emit(h, self.pr_ent[i].sub, &self.pr_ent[i].res, n_out)
                i += 1
            n_cand += i - self.pr_off[a]
            if n_out >= h.stop:
                break
        self.candidates += n_cand
        t = 0
        while t < self.n_pending and n_out < h.stop:
            i = self.pending[t]
            n_out = _take(h, i, self._holds(self.prog[i], self.prog_len[i]), n_out)
            t += 1
        return n_out

    cdef list _match_one(self, dict publication):
        cdef int i
        cdef list keep = []
        cdef list keys
        cdef PyObject* key
        cdef int n_out = self._collect(publication, keep, False)
        # The keys' reference counts are scattered in memory: fetch them ahead of use.
        keys = self._keys
        result = PyList_New(n_out)
        for i in range(min(n_out, 8)):
            _prefetch(_list_item(keys, self.out[i]), 1, 3)
        for i in range(n_out):
            if i + 8 < n_out:
                _prefetch(_list_item(keys, self.out[i + 8]), 1, 3)
            key = _list_item(keys, self.out[i])
            _incref(key)
            _list_set(result, i, key)
        return result

    cdef int _refresh(self) except -1:
        if (self.n_pending > self.pending_limit + (self.n_indexed - self.n_dead) // 32
                or self.n_dead > 64 + self.n_indexed // 4):
            self._build()
        return 0

    def match(self, publication):
        """Keys of the subscriptions ``publication`` satisfies, each once, in no set order."""
        if type(publication) is not dict:
            publication = dict(publication)
        self._refresh()
        return self._match_one(publication)

    def match_groups(self, publication):
        """``{group: key}``: every group with a matching subscription, each with one of
        its matching keys (subscriptions added without a group are left out). The search
        stops once every group holding a live subscription has a match."""
        cdef int i, sub, n_out
        cdef list keep = []
        cdef dict result = {}
        if type(publication) is not dict:
            publication = dict(publication)
        self._refresh()
        if self.n_groups == 0:
            return result
        try:
            n_out = self._collect(publication, keep, True)
        except BaseException:
            memset(self.seen, 0, self.seen_cap)
            raise
        for i in range(n_out):
            sub = self.out[i]
            self.seen[self.grp[sub]] = 0
            result[self.grp[sub]] = self._keys[sub]
        return result

    cdef int _grow_groups(self, int g) except -1:
        """Room for group ids up to ``g`` in ``seen`` and ``grp_live``."""
        cdef int old = self.seen_cap
        self.seen_cap = max(64, 2 * (g + 1))
        self.seen = <char*>_alloc(self.seen, self.seen_cap)
        memset(self.seen + old, 0, self.seen_cap - old)
        self.grp_live = <int*>_alloc(self.grp_live, self.seen_cap * sizeof(int))
        memset(self.grp_live + old, 0, (self.seen_cap - old) * sizeof(int))
        return 0

    def match_many(self, publications):

        """``[self.match(p) for p in publications]``, with the call overhead paid once."""
        self._refresh()
        return [self._match_one(p if type(p) is dict else dict(p)) for p in publications]
