# C types, opcodes, comparators and search helpers of the compiled matcher
# (included by _match.pyx; the design is in its docstring).

cdef extern from "Python.h":
    # the list macros on borrowed pointers, to touch each key's refcount once (a list's
    # items: PySequence_Fast_ITEMS)
    PyObject* _list_item "PyList_GET_ITEM"(object, Py_ssize_t)
    PyObject** _list_items "PySequence_Fast_ITEMS"(object)
    void _incref "Py_INCREF"(PyObject*)
    void _prefetch "__builtin_prefetch"(const void*, int, int)
    int _ctz "__builtin_ctzll"(uint64_t)

cdef extern from *:
    """
    /* A list of n items whose array is allocated but not filled (PyList_New zero-fills
       it): the caller must store all n items before any Python code runs. */
    static PyObject* octopis_list_unfilled(Py_ssize_t n) {
        PyObject* list = PyList_New(0);
        PyObject** items;
        if (list == NULL || n <= 0)
            return list;
        items = (PyObject**)PyMem_Malloc((size_t)n * sizeof(PyObject*));
        if (items == NULL) {
            Py_DECREF(list);
            return PyErr_NoMemory();
        }
        ((PyListObject*)list)->ob_item = items;
        ((PyListObject*)list)->allocated = n;
        Py_SET_SIZE(list, n);
        return list;
    }
    """
    list _list_unfilled "octopis_list_unfilled"(Py_ssize_t)

cdef double INF = float("inf")
cdef long long MAX_INTEGER = 2 ** 53  # octopis.filters.limits.MAX_INTEGER

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

# String lookups (cell kinds); they equal ``op - STR_EQ``.
cdef enum:
    BY_EQ = 0
    BY_PREFIX = 1
    BY_POSTFIX = 2

cdef enum:
    KIND_NUM = 1
    KIND_STR = 2

cdef enum:
    FREE = 0
    LIVE = 1
    DEAD = 2

# Bitmap geometry: at most NUM_BUCKETS numeric buckets and STR_BUCKETS strings with a
# bucket of their own per attribute; a scan ANDs a chunk of at most CHUNK words at a time,
# and a run of RUN or more words that test the same attributes starts a chunk.
cdef enum:
    NUM_BUCKETS = 256
    STR_BUCKETS = 64
    CHUNK = 32
    RUN = 4
    SLICE = 8192
    QUANTILES = 1024
    PREFETCH_BYTES = 1 << 20  # an index this large is read from memory: prefetch chunks

# A build costs about as much as verifying REBUILD_WORK pending subscriptions per indexed
# one (a rebuild waits until the pending ones verified since the last have cost that much).
cdef enum:
    REBUILD_WORK = 64

# How an edge is decided (see Edge); EDGE_GE and EDGE_LE index the scan's (x, -x).
cdef enum:
    EDGE_GE = 0
    EDGE_LE = 1
    EDGE_SID = 2
    EDGE_PROGRAM = 3
    EDGE_RANGE = 4  # _judge's: a range alone, which _put writes as EDGE_GE or EDGE_LE

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


cdef struct Placed:
    # a subscription's place in the slot order: its cell (-1: the root, else
    # (sid << 32) | 3 * attr + kind of its access predicate), the attributes its bitmaps
    # test (_signature), its key range (_key_ranges) and the range's attribute (``first``,
    # INT_MAX: none), which of its predicates is the access (-1: none); ``lead`` and ``run``
    # (_key_ranges) and ``slice`` (_slices) order it
    int64_t cell
    uint64_t sig
    uint64_t run
    double lo
    double hi
    int first
    int lead
    int slice
    int sub
    int access


cdef struct Cell:
    # the slots [beg, end) of the subscriptions accessed by string lookup (sid, key)
    int sid
    int key
    int beg
    int end


cdef struct Edge:
    # a subscription whose predicates on a column's attribute hold for some values of a
    # bucket but not all, and how to decide it: EDGE_GE ``bound <= number``, EDGE_LE
    # ``bound <= -number`` (a range's one end that lies in the bucket, its upper end
    # negated), EDGE_SID ``string id == bound``, EDGE_PROGRAM its predicates on the
    # attribute (16 bytes: four to a cache line)
    double bound
    int slot
    int how


cdef struct Column:
    # the bitmaps of one attribute over the ``nw`` words holding a subscription that
    # tests it (position k is word words[k]): bucket b's *sure* bits (the predicates on
    # the attribute hold for every value of the bucket; a subscription that does not test
    # the attribute has them all) at sure + b·nw, its edges sorted by slot from
    # edges[edge_off[b]], closed by one with slot INT_MAX; edges[edge_at[b·n_pieces + q]]
    # is its first edge in or after the column's q-th piece (so that a scan skipping
    # chunks need not walk over their edges). Buckets: numeric [split[b-1], split[b]) for
    # b < n_num, NaN, a string of its own per sid in ``sids`` (sorted), any other string,
    # absent.
    int nw
    int n_pieces
    int n_num
    int n_str
    int* words
    double* split
    int* sids
    uint64_t* sure
    int* edge_off
    Edge* edges
    int* edge_at


cdef struct Piece:
    # the positions [k0, k1) of column ``attr`` whose words lie in one chunk, whether
    # these words are consecutive, and which of the column's pieces it is (``pk``)
    int attr
    int pk
    int k0
    int k1
    bint consecutive


cdef struct Hot:
    # what a scan reads and writes, copied out of the Matcher so that the compiler keeps
    # it in registers: per attribute its sure bits, its next edge (edges are tested and
    # consumed as the scan advances), the edge index of its bucket and the last piece
    # whose edges the cursor is past (``cur_pk``); per chunk the hull of its key ranges;
    # in group mode (``groups``) ``out`` takes one
    # subscription per group (``grp``: by slot, ``seen`` marks the groups taken,
    # ``out_grp`` their groups) and the scan stops once it holds ``stop``; otherwise every
    # word with a match goes to ``hit_w`` and its bits to ``hit_bits`` (``n_hit`` of them)
    const uint64_t* live
    const int* slot_sub
    const int* grp
    const int* word_chunk
    const int* chunk_w0
    const int* chunk_off
    const int* chunk_key
    const double* chunk_lo
    const double* chunk_hi
    const double* val
    const Piece* pieces
    const Column* columns
    uint64_t** cur_sure
    Edge** cur_edge
    const int** cur_at
    int* cur_pk
    char* seen
    int* out
    int* out_grp
    int* hit_w
    uint64_t* hit_bits
    int n_hit
    long long candidates
    bint prefetch
    int stop
    bint groups


cdef extern from *:
    """
    /* The bits set in the n words at w, with the CPU's popcount instruction where it has
       one: the build targets x86-64 CPUs without it (where __builtin_popcountll is a
       library call), so the instruction is chosen at run time. */
    static Py_ssize_t octopis_bits_soft(const uint64_t* w, Py_ssize_t n) {
        Py_ssize_t total = 0, i;
        uint64_t x;
        for (i = 0; i < n; i++) {
            x = w[i];
            x -= (x >> 1) & 0x5555555555555555ULL;
            x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
            x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
            total += (Py_ssize_t)((x * 0x0101010101010101ULL) >> 56);
        }
        return total;
    }
    #if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__POPCNT__)
    __attribute__((target("popcnt")))
    static Py_ssize_t octopis_bits_hard(const uint64_t* w, Py_ssize_t n) {
        Py_ssize_t total = 0, i;
        for (i = 0; i < n; i++)
            total += __builtin_popcountll(w[i]);
        return total;
    }
    static Py_ssize_t octopis_count_bits(const uint64_t* w, Py_ssize_t n) {
        return __builtin_cpu_supports("popcnt") ? octopis_bits_hard(w, n)
                                                : octopis_bits_soft(w, n);
    }
    #elif defined(__GNUC__)
    static Py_ssize_t octopis_count_bits(const uint64_t* w, Py_ssize_t n) {
        Py_ssize_t total = 0, i;
        for (i = 0; i < n; i++)
            total += __builtin_popcountll(w[i]);
        return total;
    }
    #else
    #define octopis_count_bits octopis_bits_soft
    #endif
    """
    Py_ssize_t _count_bits "octopis_count_bits"(const uint64_t*, Py_ssize_t) noexcept nogil


cdef void* _alloc(void* p, size_t n) except NULL:
    cdef void* q = PyMem_Realloc(p, n if n > 0 else 1)
    if q == NULL:
        raise MemoryError()
    return q


cdef int _sort_doubles(double* a, Py_ssize_t n) except -1:
    """Sort ``n`` doubles (no NaN) in place: by radix, a byte at a time from the lowest,
    on integers that order as the doubles do, passing over the bytes all share (no
    comparison to mispredict; a comparison sort through ``qsort`` had been the slowest
    part of a build)."""
    cdef Py_ssize_t i, b, shift, total
    cdef uint64_t u
    cdef uint64_t* keys = NULL
    cdef uint64_t* tmp = NULL
    cdef uint64_t* swap
    cdef Py_ssize_t count[8][256]
    if n < 2:
        return 0
    try:
        keys = <uint64_t*>_alloc(NULL, n * sizeof(uint64_t))
        tmp = <uint64_t*>_alloc(NULL, n * sizeof(uint64_t))
        memset(count, 0, sizeof(count))
        for i in range(n):
            memcpy(&u, &a[i], sizeof(uint64_t))
            u = ~u if u >> 63 else u | ((<uint64_t>1) << 63)  # negatives reversed, below
            keys[i] = u
            for b in range(8):
                count[b][(u >> (8 * b)) & 255] += 1
        for b in range(8):
            shift = 8 * b
            if count[b][(keys[0] >> shift) & 255] == n:  # every key has this byte
                continue
            total = 0
            for i in range(256):
                total += count[b][i]
                count[b][i] = total - count[b][i]
            for i in range(n):
                tmp[count[b][(keys[i] >> shift) & 255]] = keys[i]
                count[b][(keys[i] >> shift) & 255] += 1
            swap = keys
            keys = tmp
            tmp = swap
        for i in range(n):
            u = keys[i]
            u = u & ~((<uint64_t>1) << 63) if u >> 63 else ~u
            memcpy(&a[i], &u, sizeof(uint64_t))
    finally:
        PyMem_Free(keys)
        PyMem_Free(tmp)
    return 0


cdef int _cmp_int64(const void* x, const void* y) noexcept nogil:
    cdef int64_t a = (<const int64_t*>x)[0]
    cdef int64_t b = (<const int64_t*>y)[0]
    return (a > b) - (a < b)


cdef int _cmp_signature(const void* x, const void* y) noexcept nogil:
    """By cell and signature."""
    cdef const Placed* p = <const Placed*>x
    cdef const Placed* q = <const Placed*>y
    if p.cell != q.cell:
        return (p.cell > q.cell) - (p.cell < q.cell)
    return (p.sig > q.sig) - (p.sig < q.sig)


cdef int _cmp_slice_signature(const void* x, const void* y) noexcept nogil:
    """By cell, by ``lead``, by slice, by signature."""
    cdef const Placed* p = <const Placed*>x
    cdef const Placed* q = <const Placed*>y
    if p.cell != q.cell:
        return (p.cell > q.cell) - (p.cell < q.cell)
    if p.lead != q.lead:
        return (p.lead > q.lead) - (p.lead < q.lead)
    if p.slice != q.slice:
        return (p.slice > q.slice) - (p.slice < q.slice)
    return (p.sig > q.sig) - (p.sig < q.sig)


cdef int _cmp_key(const void* x, const void* y) noexcept nogil:
    """By cell, by ``lead``, by the key range."""
    cdef const Placed* p = <const Placed*>x
    cdef const Placed* q = <const Placed*>y
    if p.cell != q.cell:
        return (p.cell > q.cell) - (p.cell < q.cell)
    if p.lead != q.lead:
        return (p.lead > q.lead) - (p.lead < q.lead)
    if p.lo != q.lo:
        return (p.lo > q.lo) - (p.lo < q.lo)
    if p.hi != q.hi:
        return (p.hi > q.hi) - (p.hi < q.hi)
    return (p.sub > q.sub) - (p.sub < q.sub)


cdef int _cmp_placed(const void* x, const void* y) noexcept nogil:
    """The slot order: by cell, by ``lead``, by slice, by run, by the key range."""
    cdef const Placed* p = <const Placed*>x
    cdef const Placed* q = <const Placed*>y
    if p.cell != q.cell:
        return (p.cell > q.cell) - (p.cell < q.cell)
    if p.lead != q.lead:
        return (p.lead > q.lead) - (p.lead < q.lead)
    if p.slice != q.slice:
        return (p.slice > q.slice) - (p.slice < q.slice)
    if p.run != q.run:
        return (p.run > q.run) - (p.run < q.run)
    if p.lo != q.lo:
        return (p.lo > q.lo) - (p.lo < q.lo)
    if p.hi != q.hi:
        return (p.hi > q.hi) - (p.hi < q.hi)
    return (p.sub > q.sub) - (p.sub < q.sub)


cdef inline int _upper(const double* a, int n, double x) noexcept nogil:
    """First index i with a[i] > x (0 for a NaN ``x``). Branch-free: the halving picks its
    half by a conditional move, so the search does not stall on a mispredicted branch at
    every step (it ran on every numeric attribute of every publication)."""
    cdef const double* base = a
    cdef int half
    if n <= 0:
        return 0
    while n > 1:
        half = n >> 1
        base = base + half if base[half] <= x else base
        n -= half
    return <int>(base - a) + (base[0] <= x)


cdef inline int _find(const int* a, int n, int x) noexcept nogil:
    """Index of x in the sorted array a, or n."""
    cdef int lo = 0, hi = n, mid
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < n and a[lo] == x else n


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


cdef bint _str_holds(const Pred* p, int sid, const char* s, Py_ssize_t la) noexcept nogil:
    """Whether the string predicate ``p`` holds for the string ``s`` (UTF-8, ``la``
    bytes) whose interned id is ``sid`` (-1 if it is not interned)."""
    cdef int c, op = p.op
    if op == STR_EQ:
        return sid == p.sid
    if op == STR_NE:
        return sid != p.sid
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
