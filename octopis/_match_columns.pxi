# The columns of the index (included by _match.pyx after _match_index.pxi, whose
# ``_build`` calls ``_fill_columns``): every attribute's buckets, cut at quantiles of
# its ranges' boundaries and at its most frequent string constants, the sure bitmap of
# each bucket and the edges (predicates that hold for some of its values only).


cdef int _fill_columns(Matcher m, const Placed* placed, int n_attrs, const double* pts,
                       const int* off) except -1:
    """Every column's buckets — numeric ones cut at up to NUM_BUCKETS - 1 quantiles of
    the boundaries of its ranges (``pts`` from ``off``: _range_points), a bucket of its own
    for each of the STR_BUCKETS most frequent eq/neq constants — its sure bitmaps and
    edges; then every column points at its absent bucket."""
    cdef int s, i, j, a, n, end, access, fill_pass, n_str = 0, n_runs, nb
    cdef int n_cursor = 0
    cdef int* fill = NULL
    cdef int64_t* strs = NULL
    cdef int64_t* runs = NULL
    cdef int* cursor = NULL
    cdef const char** sptr = NULL
    cdef Py_ssize_t* slen = NULL
    cdef const Pred* p
    cdef const Pred* q
    cdef Column* c
    cdef size_t size
    try:
        # the eq/neq constants, per attribute
        fill = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
        for fill_pass in range(2):
            for s in range(m.n_slots):
                p = m.prog[placed[s].sub]
                n = m.prog_len[placed[s].sub]
                access = placed[s].access
                i = _tested(p, n, 0, access, &end)
                while i < n:
                    for j in range(i, end):
                        q = &p[j]
                        if j != access and (q.op == STR_EQ or q.op == STR_NE):
                            if fill_pass:
                                strs[n_str] = ((<int64_t>q.attr) << 32) | q.sid
                            n_str += 1
                    i = _tested(p, n, end, access, &end)
            if not fill_pass:
                strs = <int64_t*>_alloc(NULL, n_str * sizeof(int64_t))
                runs = <int64_t*>_alloc(NULL, n_str * sizeof(int64_t))
                n_str = 0
        qsort(strs, n_str, sizeof(int64_t), _cmp_int64)

        j = 0
        for a in range(n_attrs):
            c = &m.columns[a]
            _cut(c, pts + off[a], off[a + 1] - off[a])
            n_runs = 0
            while j < n_str and (strs[j] >> 32) == a:
                i = j
                while j < n_str and strs[j] == strs[i]:
                    j += 1
                runs[n_runs] = ((<int64_t>(j - i)) << 32) | (strs[i] & 0xffffffff)
                n_runs += 1
            _own_strings(c, runs, n_runs)
            nb = c.n_num + c.n_str + 3
            size = nb * c.nw * sizeof(uint64_t)
            c.sure = <uint64_t*>_alloc(NULL, size)
            memset(c.sure, 0, size)
            c.edge_off = <int*>_alloc(NULL, (nb + 1) * sizeof(int))
            memset(c.edge_off, 0, (nb + 1) * sizeof(int))
            fill[a] = n_cursor
            n_cursor += nb
            m.index_bytes += (size + (c.n_num - 1) * sizeof(double) + c.n_str * sizeof(int)
                              + (nb + 1) * sizeof(int))

        # the UTF-8 bytes of every string constant, for the buckets of their own
        n = len(m._str_bytes)
        sptr = <const char**>_alloc(NULL, n * sizeof(char*))
        slen = <Py_ssize_t*>_alloc(NULL, n * sizeof(Py_ssize_t))
        for i in range(n):
            encoded = m._str_bytes[i]
            sptr[i] = PyBytes_AS_STRING(encoded) if encoded is not None else NULL
            slen[i] = PyBytes_GET_SIZE(encoded) if encoded is not None else 0
        # sure bits and edge counts, the sure bits of the subscriptions that do not test
        # the attribute, then the edges (cursor: each bucket's next edge)
        _judge_all(m, placed, sptr, slen, NULL, fill)
        for a in range(n_attrs):
            _runs_to_bits(&m.columns[a])
            _sure_untested(m, placed, &m.columns[a], a)
        cursor = <int*>_alloc(NULL, n_cursor * sizeof(int))
        for a in range(n_attrs):
            c = &m.columns[a]
            nb = c.n_num + c.n_str + 3
            for i in range(nb):
                c.edge_off[i + 1] += c.edge_off[i] + 1
                cursor[fill[a] + i] = c.edge_off[i]
            c.edges = <Edge*>_alloc(NULL, c.edge_off[nb] * sizeof(Edge))
            for i in range(nb):
                c.edges[c.edge_off[i + 1] - 1].slot = INT_MAX
            m.index_bytes += c.edge_off[nb] * sizeof(Edge)
        _judge_all(m, placed, sptr, slen, cursor, fill)
        _fill_edge_at(m, n_attrs)

        m.cur_sure = <uint64_t**>_alloc(NULL, n_attrs * sizeof(uint64_t*))
        m.cur_edge = <Edge**>_alloc(NULL, n_attrs * sizeof(Edge*))
        m.cur_at = <const int**>_alloc(NULL, n_attrs * sizeof(int*))
        m.cur_pk = <int*>_alloc(NULL, n_attrs * sizeof(int))
        for a in range(n_attrs):
            _aim(m, a, _absent(&m.columns[a]))
        m.index_bytes += n_attrs * (sizeof(Column) + sizeof(uint64_t*) + sizeof(Edge*)
                                    + sizeof(int*) + sizeof(int))
    finally:
        PyMem_Free(fill)
        PyMem_Free(strs)
        PyMem_Free(runs)
        PyMem_Free(cursor)
        PyMem_Free(<void*>sptr)
        PyMem_Free(slen)
    return 0


cdef int _fill_edge_at(Matcher m, int n_attrs) except -1:
    """Every column's ``edge_at``: per bucket and piece, its first edge at or after the
    piece's first word."""
    cdef int a, b, q, e, i, nb, n_total = 0
    cdef int* first = NULL  # per column, from off[a]: the first slot of each piece
    cdef int* off = NULL
    cdef Column* c
    try:
        off = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
        for a in range(n_attrs):
            off[a] = n_total
            n_total += m.columns[a].n_pieces
        first = <int*>_alloc(NULL, n_total * sizeof(int))
        for i in range(n_total):  # the pieces of all chunks
            a = m.pieces[i].attr
            first[off[a] + m.pieces[i].pk] = m.columns[a].words[m.pieces[i].k0] << 6
        for a in range(n_attrs):
            c = &m.columns[a]
            nb = c.n_num + c.n_str + 3
            c.edge_at = <int*>_alloc(NULL, nb * c.n_pieces * sizeof(int))
            for b in range(nb):
                e = c.edge_off[b]
                for q in range(c.n_pieces):
                    while c.edges[e].slot < first[off[a] + q]:
                        e += 1
                    c.edge_at[b * c.n_pieces + q] = e
            m.index_bytes += nb * c.n_pieces * sizeof(int)
    finally:
        PyMem_Free(first)
        PyMem_Free(off)
    return 0


cdef int _cut(Column* c, const double* pts, int n) except -1:
    """Numeric buckets at up to NUM_BUCKETS - 1 quantiles of the ``n`` sorted points."""
    cdef int i
    cdef double v
    c.split = <double*>_alloc(NULL, min(n, NUM_BUCKETS - 1) * sizeof(double))
    c.n_num = 1
    for i in range(1, NUM_BUCKETS if n else 1):
        v = pts[i * n // NUM_BUCKETS]
        if c.n_num == 1 or v > c.split[c.n_num - 2]:
            c.split[c.n_num - 1] = v
            c.n_num += 1
    return 0


cdef int _own_strings(Column* c, int64_t* runs, int n) except -1:
    """Buckets of their own for the STR_BUCKETS most frequent of the ``n`` constants
    (``runs``: count << 32 | sid), sorted by sid."""
    cdef int i, j, sid
    qsort(runs, n, sizeof(int64_t), _cmp_int64)
    c.n_str = min(n, STR_BUCKETS)
    c.sids = <int*>_alloc(NULL, c.n_str * sizeof(int))
    for i in range(c.n_str):
        sid = <int>(runs[n - 1 - i] & 0xffffffff)
        j = i
        while j > 0 and c.sids[j - 1] > sid:
            c.sids[j] = c.sids[j - 1]
            j -= 1
        c.sids[j] = sid
    return 0


cdef void _sure_untested(Matcher m, const Placed* placed, Column* c, int a) noexcept:
    """Set, in every bucket of column ``c``, the sure bits of the slots whose
    subscriptions do not test attribute ``a``."""
    cdef int k, b, s, i, n, end, access, nb = c.n_num + c.n_str + 3
    cdef uint64_t tested
    cdef const Pred* p
    for k in range(c.nw):
        tested = 0
        for s in range(64 * c.words[k], min(m.n_slots, 64 * c.words[k] + 64)):
            p = m.prog[placed[s].sub]
            n = m.prog_len[placed[s].sub]
            access = placed[s].access
            i = _tested(p, n, 0, access, &end)
            while i < n and p[i].attr != a:
                i = _tested(p, n, end, access, &end)
            if i < n:
                tested |= (<uint64_t>1) << (s & 63)
        for b in range(nb):
            c.sure[<Py_ssize_t>b * c.nw + k] |= ~tested


cdef void _judge_all(Matcher m, const Placed* placed, const char** sptr,
                     const Py_ssize_t* slen, int* cursor, const int* base) noexcept:
    """``_judge`` every subscription on every attribute its bitmaps test."""
    cdef int s, w, i, j, k, n, end, access
    cdef const Pred* p
    for s in range(m.n_slots):
        p = m.prog[placed[s].sub]
        n = m.prog_len[placed[s].sub]
        access = placed[s].access
        w = s >> 6
        i = _tested(p, n, 0, access, &end)
        while i < n:
            j = m.chunk_off[m.word_chunk[w]]
            while m.pieces[j].attr != p[i].attr:
                j += 1
            k = m.pieces[j].k0
            while m.columns[p[i].attr].words[k] != w:
                k += 1
            _judge(&m.columns[p[i].attr], k, s, p, i, end, access, sptr, slen,
                   NULL if cursor == NULL else cursor + base[p[i].attr])
            i = _tested(p, n, end, access, &end)


cdef void _judge(Column* c, int k, int slot, const Pred* p, int i, int end, int access,
                 const char** sptr, const Py_ssize_t* slen, int* cursor) noexcept:
    """Judge the subscription in ``slot`` (position k of column ``c``) by its predicates
    p[i:end] on the column's attribute (p[access] aside): with ``cursor`` NULL, set its
    sure bit in the buckets where they hold for every value and count an edge in those
    where they hold for some; else write those edges at ``cursor[bucket]``."""
    cdef bint has_num = 0, has_str = 0, has_range = 0, sure, may
    cdef double lo = -INF, hi = INF
    cdef int b, b0, b1, j, t, sid, n_tests = 0, n_ne = 0, n_split = c.n_num - 1
    cdef int other = c.n_num + c.n_str + 1, how = EDGE_PROGRAM
    cdef int ne_bucket[66]
    for j in range(i, end):
        if j == access or p[j].op == PRESENT:
            continue
        n_tests += 1
        if p[j].op == NUM_RANGE:
            has_num = has_range = 1
            lo = p[j].lo
            hi = p[j].hi
        elif p[j].op == NUM_NE:
            has_num = 1
            if n_ne < 64:
                ne_bucket[n_ne] = _upper(c.split, n_split, p[j].lo)
                n_ne += 1
        else:
            has_str = 1
    if not has_str:
        # bucket b is [split[b-1], split[b]); the range covers the buckets between those
        # of lo and hi, and these two if it starts and ends with them; a bucket holding a
        # <> constant is left undecided
        b0 = _upper(c.split, n_split, lo)
        b1 = _upper(c.split, n_split, hi)
        if has_range and n_tests == 1:
            how = EDGE_RANGE
        if n_ne == 64:  # more <> than ne_bucket holds: decide them one by one
            for b in range(b0, b1 + 1):
                _put(c, b, k, slot, 1, 0, how, lo, hi, cursor)
        else:
            # sure from the first bucket it covers whole to the last, but in the buckets
            # of its <> constants: runs of sure buckets, and edges in the others
            ne_bucket[n_ne] = b0 - (lo == (c.split[b0 - 1] if b0 > 0 else -INF))
            ne_bucket[n_ne + 1] = b1 + (hi == INF if b1 == n_split else c.split[b1] == nextafter(hi, INF))
            n_ne += 2
            for t in range(1, n_ne):  # insertion sort (a few), then without repeats
                b = ne_bucket[t]
                j = t
                while j > 0 and ne_bucket[j - 1] > b:
                    ne_bucket[j] = ne_bucket[j - 1]
                    j -= 1
                ne_bucket[j] = b
            j = 1
            for t in range(1, n_ne):
                if ne_bucket[t] != ne_bucket[j - 1]:
                    ne_bucket[j] = ne_bucket[t]
                    j += 1
            n_ne = j
            for t in range(n_ne):
                b = ne_bucket[t]
                if b0 <= b <= b1:
                    _put(c, b, k, slot, 1, 0, how, lo, hi, cursor)
                if cursor == NULL and t + 1 < n_ne and ne_bucket[t + 1] > b + 1:
                    _sure_run(c, k, slot, max(b + 1, b0), min(ne_bucket[t + 1] - 1, b1))
        _put(c, c.n_num, k, slot, not has_range, not has_range, how, lo, hi, cursor)  # NaN
    if not has_num:
        for b in range(c.n_str):
            sid = c.sids[b]
            may = 1
            for j in range(i, end):
                if may and j != access and p[j].op != PRESENT:
                    may = _str_holds(&p[j], sid, sptr[sid], slen[sid])
            _put(c, c.n_num + 1 + b, k, slot, may, may, how, lo, hi, cursor)
        # any other string: eq fails on a constant with a bucket of its own, neq holds
        may = sure = 1
        for j in range(i, end):
            if j == access or p[j].op == PRESENT:
                continue
            if p[j].op == STR_EQ and _find(c.sids, c.n_str, p[j].sid) < c.n_str:
                may = 0
            elif p[j].op != STR_NE or _find(c.sids, c.n_str, p[j].sid) == c.n_str:
                sure = 0
                if p[j].op == STR_EQ and n_tests == 1:
                    how = EDGE_SID
                    lo = hi = p[j].sid
        _put(c, other, k, slot, may, may and sure, how, lo, hi, cursor)


cdef inline void _sure_run(Column* c, int k, int slot, int b0, int b1) noexcept:
    """The sure bit of ``slot`` (word k) in the numeric buckets b0 to b1, as toggles at b0
    and after b1, which :func:`_runs_to_bits` turns into the bits of every bucket."""
    cdef uint64_t bit = (<uint64_t>1) << (slot & 63)
    if b0 > b1:
        return
    c.sure[<Py_ssize_t>b0 * c.nw + k] ^= bit
    if b1 + 1 < c.n_num:
        c.sure[<Py_ssize_t>(b1 + 1) * c.nw + k] ^= bit


cdef void _runs_to_bits(Column* c) noexcept:
    """Each numeric bucket's sure bits from the toggles of :func:`_sure_run` (a bit is
    set from the bucket that toggles it on to the one that toggles it off)."""
    cdef Py_ssize_t b, k
    cdef uint64_t* row
    for b in range(1, c.n_num):
        row = c.sure + b * c.nw
        for k in range(c.nw):
            row[k] ^= row[k - c.nw]


cdef inline void _put(Column* c, int b, int k, int slot, bint may, bint sure, int how,
                      double lo, double hi, int* cursor) noexcept:
    """Bucket b of a subscription: with ``cursor`` NULL, set its sure bit (word k) if
    ``sure``, count an edge if only ``may``; else write that edge at ``cursor[b]``. A
    range alone (EDGE_RANGE, only in numeric buckets) is written as the test of the end
    that lies in the bucket (EDGE_GE ``lo``, EDGE_LE ``-hi``), or EDGE_PROGRAM if both do."""
    cdef Edge* e
    cdef bint below, above
    if cursor == NULL:
        if sure:
            c.sure[<Py_ssize_t>b * c.nw + k] |= (<uint64_t>1) << (slot & 63)
        elif may:
            c.edge_off[b + 1] += 1
        return
    if sure or not may:
        return
    e = &c.edges[cursor[b]]
    cursor[b] += 1
    e.bound = lo
    e.slot = slot
    e.how = how
    if how == EDGE_RANGE:  # bucket b is [split[b - 1], split[b]), the outer ones open-ended
        below = lo > (c.split[b - 1] if b > 0 else -INF)
        above = hi < (nextafter(c.split[b], -INF) if b < c.n_num - 1 else INF)
        e.how = EDGE_PROGRAM if below and above else EDGE_LE if above else EDGE_GE
        if e.how == EDGE_LE:
            e.bound = -hi
