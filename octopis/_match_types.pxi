# C types, opcodes, comparators and search helpers of the compiled matcher
# (included by _match.pyx; the design is in its docstring).

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


cdef struct Residuals:
    # Residual programs of the subscriptions being indexed (sub's at preds[beg[sub]],
    # length[sub] of them) and how many fast and slow copies are placed so far.
    Pred* preds
    int* beg
    int* length
    int n_fast
    int n_slow


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
