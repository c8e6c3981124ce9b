# Index construction (included by _match.pyx). ``_build``: each live subscription's
# access (a string lookup, or the root), the attributes its bitmaps test and its key range,
# sorted into the slot order; ``_fill_slots`` lays out slots, live bits and cells,
# ``_fill_chunks`` the attributes of each word and the chunks, ``_fill_columns`` every
# attribute's buckets, sure bitmaps and edges.

cdef enum:
    NEVER = -2  # _access: the subscription can never match


cdef int _build(Matcher m) except -1:
    cdef int i, j, sub, access, n_keys = 0, n_placed = 0, n_never = 0, total = 0
    cdef int n_attrs = len(m._attr_refs)
    cdef int n_strs = len(m._str_refs)
    cdef int counts[4]
    cdef Pred* p
    cdef int64_t* keys = NULL
    cdef int* key_total = NULL
    cdef Placed* placed = NULL
    cdef double* pts = NULL
    cdef int* pts_off = NULL
    cdef double* qts = NULL
    cdef int* qts_off = NULL

    m._free_index()
    m._free_strs.extend(m._retired_strs)
    m._retired_strs = []
    for sub in range(m.n_ids):
        if m.state[sub] == DEAD:
            m.state[sub] = FREE
            m._free.append(sub)
        elif m.state[sub] == LIVE:
            total += m.prog_len[sub]
    try:
        # The string constants of all subscriptions stand for the values of each attribute:
        # keys (3·attr + kind, sid) of every eq, str-prefix and str-postfix, sorted.
        keys = <int64_t*>_alloc(NULL, total * sizeof(int64_t))
        key_total = <int*>_alloc(NULL, 3 * n_attrs * sizeof(int))
        memset(key_total, 0, 3 * n_attrs * sizeof(int))
        for sub in range(m.n_ids):
            if m.state[sub] != LIVE:
                continue
            p = m.prog[sub]
            for i in range(m.prog_len[sub]):
                if STR_EQ <= p[i].op <= STR_POSTFIX:
                    j = 3 * p[i].attr + p[i].op - STR_EQ
                    keys[n_keys] = ((<int64_t>j) << 32) | p[i].sid
                    key_total[j] += 1
                    n_keys += 1
        qsort(keys, n_keys, sizeof(int64_t), _cmp_int64)

        placed = <Placed*>_alloc(NULL, m.n_live * sizeof(Placed))
        for sub in range(m.n_ids):
            m.indexed[sub] = m.state[sub] == LIVE
            m.slot_of[sub] = -1
            if m.state[sub] != LIVE:
                continue
            p = m.prog[sub]
            access = _access(p, m.prog_len[sub], keys, n_keys, key_total)
            if access == NEVER:
                n_never += 1
                continue
            placed[n_placed].sub = sub
            placed[n_placed].access = access
            placed[n_placed].cell = -1 if access < 0 else (
                ((<int64_t>p[access].sid) << 32) | (3 * p[access].attr + p[access].op - STR_EQ))
            placed[n_placed].sig = _signature(p, m.prog_len[sub], access)
            n_placed += 1
        pts_off = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
        pts = _range_points(m, placed, n_placed, n_attrs, pts_off)
        qts_off = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
        qts = _quantiles(pts, pts_off, n_attrs, qts_off)
        _key_ranges(m, placed, n_placed, qts, qts_off, n_attrs)
        _slices(placed, n_placed)
        _slice_runs(placed, n_placed)
        qsort(placed, n_placed, sizeof(Placed), _cmp_placed)

        _fill_slots(m, placed, n_placed, n_strs, n_attrs, counts)
        _fill_chunks(m, placed, n_attrs, total)
        _fill_columns(m, placed, n_attrs, pts, pts_off)
        m.built_attrs = n_attrs
        m.built_strs = n_strs
        m.index_bytes += n_placed * 2 * sizeof(int) + m.n_words * (sizeof(uint64_t) + sizeof(int))
        m.n_pending = 0
        m.pending_work = 0
        m.n_indexed = m.n_live
        m.n_dead = 0
        m._stats.update(
            rebuilds=m._stats["rebuilds"] + 1, equality=counts[BY_EQ],
            prefix=counts[BY_PREFIX], postfix=counts[BY_POSTFIX], root=counts[3],
            never=n_never)
    except BaseException:
        m.built_attrs = n_attrs if m.columns != NULL else 0
        m._free_index()
        m.n_pending = m.n_indexed = m.n_dead = 0
        for sub in range(m.n_ids):
            m.indexed[sub] = 0
            m.slot_of[sub] = -1
            if m.state[sub] == LIVE:
                m.pend_pos[sub] = m.n_pending
                m.pending[m.n_pending] = sub
                m.n_pending += 1
        raise
    finally:
        PyMem_Free(keys)
        PyMem_Free(key_total)
        PyMem_Free(placed)
        PyMem_Free(pts)
        PyMem_Free(pts_off)
        PyMem_Free(qts)
        PyMem_Free(qts_off)
    return 0


cdef int _access(const Pred* p, int n, const int64_t* keys, int n_keys,
                 const int* key_total) noexcept:
    """The index of p's most selective eq, str-prefix or str-postfix (its constant's share
    among the constants of that kind on that attribute; on a tie not an eq, which a
    string bucket decides exactly, where an affix is left to edges), -1 if it has none,
    NEVER if p can never hold (a number and a string test on one attribute, or an empty
    range)."""
    cdef int i = 0, end, j, best = -1
    cdef bint has_num, has_str
    cdef double est, best_est = 2.0
    while i < n:
        has_num = has_str = 0
        end = i
        while end < n and p[end].attr == p[i].attr:
            if p[end].op <= NUM_NE:
                has_num = 1
                if p[end].op == NUM_RANGE and not p[end].lo <= p[end].hi:
                    return NEVER
            elif p[end].op != PRESENT:
                has_str = 1
                if p[end].op <= STR_POSTFIX:
                    j = 3 * p[end].attr + p[end].op - STR_EQ
                    est = _count(keys, n_keys, ((<int64_t>j) << 32) | p[end].sid) / <double>key_total[j]
                    if est < best_est or (est == best_est and p[end].op != STR_EQ):
                        best, best_est = end, est
            end += 1
        if has_num and has_str:
            return NEVER
        i = end
    return best


cdef inline int _tested(const Pred* p, int n, int i, int access, int* end) noexcept:
    """The next attribute group p[i:end] at or after ``i`` that has a predicate besides
    p[access]: its start (n if none), its end in ``end``."""
    cdef int j
    while i < n:
        j = i
        while j < n and p[j].attr == p[i].attr:
            j += 1
        if j - i > 1 or i != access:
            end[0] = j
            return i
        i = j
    end[0] = n
    return n


cdef uint64_t _signature(const Pred* p, int n, int access) noexcept:
    """The attributes p's bitmaps test, as a mask of their ids modulo 64 (sorted by it,
    neighbouring subscriptions share most of their attributes)."""
    cdef uint64_t mask = 0
    cdef int end, i = _tested(p, n, 0, access, &end)
    while i < n:
        mask |= (<uint64_t>1) << (p[i].attr & 63)
        i = _tested(p, n, end, access, &end)
    return mask


cdef double* _range_points(Matcher m, const Placed* placed, int n, int n_attrs,
                           int* off) except NULL:
    """The boundaries of the ranges of the ``n`` placed subscriptions (a closed range
    [lo, hi] has lo and the double after hi, the infinite ends none), sorted, attribute a's
    at [off[a], off[a + 1]) of the array returned (the caller frees it)."""
    cdef int s, i, a
    cdef const Pred* p
    cdef int* fill = NULL
    cdef double* pts = NULL
    memset(off, 0, (n_attrs + 1) * sizeof(int))
    for s in range(n):
        p = m.prog[placed[s].sub]
        for i in range(m.prog_len[placed[s].sub]):
            if p[i].op == NUM_RANGE:
                off[p[i].attr + 1] += (p[i].lo > -INF) + (p[i].hi < INF)
    for a in range(n_attrs):
        off[a + 1] += off[a]
    try:
        fill = <int*>_alloc(NULL, n_attrs * sizeof(int))
        memcpy(fill, off, n_attrs * sizeof(int))
        pts = <double*>_alloc(NULL, off[n_attrs] * sizeof(double))
        for s in range(n):
            p = m.prog[placed[s].sub]
            for i in range(m.prog_len[placed[s].sub]):
                if p[i].op != NUM_RANGE:
                    continue
                a = p[i].attr
                if p[i].lo > -INF:
                    pts[fill[a]] = p[i].lo
                    fill[a] += 1
                if p[i].hi < INF:
                    pts[fill[a]] = nextafter(p[i].hi, INF)
                    fill[a] += 1
        for a in range(n_attrs):
            _sort_doubles(pts + off[a], off[a + 1] - off[a])
    except BaseException:
        PyMem_Free(pts)
        raise
    finally:
        PyMem_Free(fill)
    return pts


cdef double* _quantiles(const double* pts, const int* off, int n_attrs, int* qoff) except NULL:
    """Up to QUANTILES evenly spaced of each attribute's sorted points (``pts`` from
    ``off``), attribute a's at [qoff[a], qoff[a + 1]) of the array returned (the caller
    frees it): a table small enough to search often."""
    cdef int a, i, n
    cdef double* q
    qoff[0] = 0
    for a in range(n_attrs):
        qoff[a + 1] = qoff[a] + min(off[a + 1] - off[a], QUANTILES)
    q = <double*>_alloc(NULL, qoff[n_attrs] * sizeof(double))
    for a in range(n_attrs):
        n = off[a + 1] - off[a]
        for i in range(qoff[a + 1] - qoff[a]):
            q[qoff[a] + i] = pts[off[a] + <int>((<int64_t>i * n) // (qoff[a + 1] - qoff[a]))]
    return q


cdef inline double _share(const Pred* q, const double* pts, const int* off) noexcept:
    """The estimated share of values the range ``q`` holds for: the share of the
    boundaries of all ranges on its attribute that lie in it (1 if there are none), from
    their quantiles (``pts`` from ``off``: _quantiles)."""
    cdef const double* a = pts + off[q.attr]
    cdef int n = off[q.attr + 1] - off[q.attr]
    if n == 0:
        return 1.0
    return (_upper(a, n, q.hi) - _upper(a, n, nextafter(q.lo, -INF))) / <double>n


cdef int _key_ranges(Matcher m, Placed* placed, int n, const double* pts, const int* off,
                     int n_attrs) except -1:
    """Each subscription's key range, by which the slot order puts it (so that the
    subscriptions a value satisfies on its attribute sit together, and a scan rules out
    runs of whole words at once): its range on the attribute chosen for its group of one
    cell and one signature, else its first range. A group of at least 64 chooses the
    attribute whose ranges hold for the smallest share of values on average
    (:func:`_share`), where that share is clearly smaller (by a fifth) than on the first
    attribute with a range; a smaller group, the first.

    And how the slot order puts it: in a cell of at least two chunks, by the key range's
    attribute first (``lead``), then by ``run``, its signature where the group fills half
    a chunk (it gets words of its own, which test its attributes only, and
    ``match_groups`` finds matches sooner), else 0; in a smaller cell, where no chunk can
    be skipped, by signature (a word then tests fewer attributes)."""
    cdef int i = 0, j, s, t, a, first, best, cell_end = 0
    cdef bint big
    cdef const Pred* p
    cdef double* total = NULL
    cdef int* count = NULL
    qsort(placed, n, sizeof(Placed), _cmp_signature)
    try:
        total = <double*>_alloc(NULL, n_attrs * sizeof(double))
        count = <int*>_alloc(NULL, n_attrs * sizeof(int))
        memset(total, 0, n_attrs * sizeof(double))
        memset(count, 0, n_attrs * sizeof(int))
        while i < n:
            if i == cell_end:
                while cell_end < n and placed[cell_end].cell == placed[i].cell:
                    cell_end += 1
                big = cell_end - i >= 2 * 64 * CHUNK
            j = i
            while j < n and placed[j].cell == placed[i].cell and placed[j].sig == placed[i].sig:
                j += 1
            first = INT_MAX
            for s in range(i, j):
                p = m.prog[placed[s].sub]
                for t in range(m.prog_len[placed[s].sub]):
                    if p[t].op == NUM_RANGE:
                        first = min(first, p[t].attr)
                        if j - i >= 64:
                            total[p[t].attr] += _share(&p[t], pts, off)
                        count[p[t].attr] += 1
            best = first
            if first != INT_MAX and count[first] == j - i and j - i >= 64:
                for t in range(m.prog_len[placed[i].sub]):  # where all the group has a range
                    a = m.prog[placed[i].sub][t].attr
                    if (m.prog[placed[i].sub][t].op == NUM_RANGE and count[a] == j - i
                            and total[a] < 0.8 * total[first] and total[a] < total[best]):
                        best = a
            for s in range(i, j):
                _key_range(m.prog[placed[s].sub], m.prog_len[placed[s].sub], best, &placed[s])
                placed[s].lead = placed[s].first if big else -1
                placed[s].run = placed[s].sig if j - i >= 64 * CHUNK // 2 or not big else 0
                p = m.prog[placed[s].sub]
                for t in range(m.prog_len[placed[s].sub]):
                    total[p[t].attr] = 0.0
                    count[p[t].attr] = 0
            i = j
    finally:
        PyMem_Free(total)
        PyMem_Free(count)
    return 0


cdef void _slices(Placed* placed, int n) noexcept:
    """Each subscription's ``slice``: which SLICE-th of the subscriptions of its cell
    and ``lead`` it falls in, by key range."""
    cdef int i = 0, j, s
    qsort(placed, n, sizeof(Placed), _cmp_key)
    while i < n:
        j = i
        while j < n and placed[j].cell == placed[i].cell and placed[j].lead == placed[i].lead:
            j += 1
        for s in range(i, j):
            placed[s].slice = (s - i) // SLICE
        i = j


cdef void _slice_runs(Placed* placed, int n) noexcept:
    """Give a ``run`` of its own (its signature) to every group of at least a word of
    subscriptions testing the same attributes within one slice: where many small groups
    share a ``lead`` (many combinations of attributes), a word then tests the attributes of
    one group, not of all, while the slice keeps the key ranges near each other."""
    cdef int i = 0, j, s
    qsort(placed, n, sizeof(Placed), _cmp_slice_signature)
    while i < n:
        j = i
        while (j < n and placed[j].cell == placed[i].cell and placed[j].lead == placed[i].lead
               and placed[j].slice == placed[i].slice and placed[j].sig == placed[i].sig):
            j += 1
        if j - i >= 64:
            for s in range(i, j):
                placed[s].run = placed[s].sig
        i = j


cdef void _key_range(const Pred* p, int n, int attr, Placed* place) noexcept:
    """p's range on ``attr``, else its first range ([inf, inf] if it has none), and its
    attribute (INT_MAX: none) into ``place``."""
    cdef int i, best = -1
    for i in range(n):
        if p[i].op == NUM_RANGE and (best < 0 or p[i].attr == attr):
            best = i
    place.lo = place.hi = INF
    place.first = INT_MAX
    if best >= 0:
        place.lo = p[best].lo
        place.hi = p[best].hi
        place.first = p[best].attr


cdef int _fill_slots(Matcher m, const Placed* placed, int n, int n_strs, int n_attrs,
                     int* counts) except -1:
    """Slots in the order of ``placed``, all live; the cells (runs of one access) and
    their lookups. ``counts`` gets the subscriptions per cell kind, then the root's."""
    cdef int s, sub, a, n_cells = 0
    cdef Cell* c = NULL
    memset(counts, 0, 4 * sizeof(int))
    m.n_slots = n
    m.n_words = (n + 63) >> 6
    m.slot_sub = <int*>_alloc(NULL, n * sizeof(int))
    m.slot_grp = <int*>_alloc(NULL, n * sizeof(int))
    m.slot_key = <PyObject**>_alloc(NULL, n * sizeof(PyObject*))
    m.live = <uint64_t*>_alloc(NULL, m.n_words * sizeof(uint64_t))
    memset(m.live, 0, m.n_words * sizeof(uint64_t))
    m.cells = <Cell*>_alloc(NULL, n * sizeof(Cell))
    m.str_off = <int*>_alloc(NULL, (n_strs + 1) * sizeof(int))
    memset(m.str_off, 0, (n_strs + 1) * sizeof(int))
    m.affixed = <char*>_alloc(NULL, n_attrs * sizeof(char))
    memset(m.affixed, 0, n_attrs)
    affixes = {}
    m._slot_keys = [_slot_copy(m._keys[placed[s].sub]) for s in range(n)]
    for s in range(n):
        sub = placed[s].sub
        if m._slot_keys[s] is not m._keys[sub]:
            m.index_bytes += m._slot_keys[s].__sizeof__()
        m.slot_sub[s] = sub
        m.slot_grp[s] = m.grp[sub]
        m.slot_key[s] = _list_item(m._slot_keys, s)
        m.slot_of[sub] = s
        m.live[s >> 6] |= (<uint64_t>1) << (s & 63)
        if placed[s].cell < 0:
            m.root_end = s + 1
            counts[3] += 1
            continue
        if s == 0 or placed[s - 1].cell != placed[s].cell:
            c = &m.cells[n_cells]
            n_cells += 1
            c.sid = <int>(placed[s].cell >> 32)
            c.key = <int>(placed[s].cell & 0xffffffff)
            c.beg = s
            m.str_off[c.sid + 1] += 1
            if c.key % 3 != BY_EQ:
                a = c.key // 3
                m.affixed[a] = 1
                affixes.setdefault((a, c.key % 3), set()).add(len(m._str_text[c.sid]))
        c.end = s + 1
        counts[c.key % 3] += 1
    for s in range(n_strs):
        m.str_off[s + 1] += m.str_off[s]
    for (a, kind), lengths in affixes.items():
        prefixes, postfixes = m._affix_lengths.get(a, ((), ()))
        if kind == BY_PREFIX:
            prefixes = tuple(sorted(lengths))
        else:
            postfixes = tuple(sorted(lengths))
        m._affix_lengths[a] = (prefixes, postfixes)
    m.n_cells = n_cells
    m.cells = <Cell*>_alloc(m.cells, n_cells * sizeof(Cell))
    m.visit = <int*>_alloc(NULL, n_cells * sizeof(int))
    # a scan of the root or of a cell may hit a word another one hits too (cells need not
    # start on a word): one entry per word and cell
    m.hit_w = <int*>_alloc(NULL, (m.n_words + n_cells + 1) * sizeof(int))
    m.hit_bits = <uint64_t*>_alloc(NULL, (m.n_words + n_cells + 1) * sizeof(uint64_t))
    m.index_bytes += (n_cells * (sizeof(Cell) + sizeof(int)) + (n_strs + 1) * sizeof(int) + n_attrs
                      + 2 * n * sizeof(PyObject*)
                      + (m.n_words + n_cells + 1) * (sizeof(int) + sizeof(uint64_t)))
    return 0


cdef object _slot_copy(object key):
    """An equal copy of ``key`` of its exact type where one is cheap — an int (past the
    small ones Python shares), a tuple (its items shared) — else ``key`` itself. Made in
    slot order at a build, the copies lie in memory as the slots do, so that ``match``,
    which takes a reference to every matching key, reads a few dense lines per word of
    hits instead of one line per key scattered over every key ever added."""
    cdef int overflow
    cdef long long value
    cdef Py_ssize_t i, n
    if PyLong_CheckExact(key):
        value = PyLong_AsLongLongAndOverflow(key, &overflow)
        if overflow or -5 <= value <= 256:
            return key
        return PyLong_FromLongLong(value)
    if PyTuple_CheckExact(key):
        n = PyTuple_GET_SIZE(key)
        if n == 0:
            return key
        copy = PyTuple_New(n)
        for i in range(n):
            item = key[i]
            Py_INCREF(item)
            PyTuple_SET_ITEM(copy, i, item)
        return copy
    return key


cdef int _fill_chunks(Matcher m, const Placed* placed, int n_attrs, int total) except -1:
    """The attributes each word's subscriptions' bitmaps test, each giving the word the
    next position of its column (``columns[a].words`` maps positions back to words); the
    chunks — at most CHUNK words, a new one also where a run of RUN or more words testing
    the same attributes begins — and per chunk a piece per column, in the order
    :func:`_order_pieces` gives them. ``total`` (the predicates of all subscriptions)
    bounds the positions."""
    cdef int w, s, last, i, j, a, k, n, end, first = 0, n_pieces = 0, n_pos = 0
    cdef int n_chunks = 0
    cdef const Pred* p
    cdef int* mark = NULL
    cdef int* votes = NULL
    cdef int* piece_of = NULL
    cdef int* pos = NULL
    cdef int* pos_off = NULL
    cdef int* run = NULL
    m.columns = <Column*>_alloc(NULL, n_attrs * sizeof(Column))
    memset(m.columns, 0, n_attrs * sizeof(Column))
    m.word_chunk = <int*>_alloc(NULL, m.n_words * sizeof(int))
    m.chunk_w0 = <int*>_alloc(NULL, (m.n_words + 1) * sizeof(int))
    m.chunk_off = <int*>_alloc(NULL, (m.n_words + 1) * sizeof(int))
    m.chunk_key = <int*>_alloc(NULL, (m.n_words + 1) * sizeof(int))
    m.chunk_lo = <double*>_alloc(NULL, (m.n_words + 1) * sizeof(double))
    m.chunk_hi = <double*>_alloc(NULL, (m.n_words + 1) * sizeof(double))
    m.pieces = <Piece*>_alloc(NULL, total * sizeof(Piece))
    try:
        mark = <int*>_alloc(NULL, n_attrs * sizeof(int))
        piece_of = <int*>_alloc(NULL, n_attrs * sizeof(int))
        votes = <int*>_alloc(NULL, n_attrs * sizeof(int))
        memset(votes, 0, n_attrs * sizeof(int))
        pos = <int*>_alloc(NULL, total * sizeof(int))  # each word's attributes, sorted
        pos_off = <int*>_alloc(NULL, (m.n_words + 1) * sizeof(int))
        run = <int*>_alloc(NULL, m.n_words * sizeof(int))
        for a in range(n_attrs):
            mark[a] = piece_of[a] = -1
        for w in range(m.n_words):
            pos_off[w] = n_pos
            last = min(m.n_slots, 64 * w + 64)
            for s in range(64 * w, last):
                p = m.prog[placed[s].sub]
                n = m.prog_len[placed[s].sub]
                i = _tested(p, n, 0, placed[s].access, &end)
                while i < n:
                    a = p[i].attr
                    if mark[a] != w:
                        mark[a] = w
                        j = n_pos
                        while j > pos_off[w] and pos[j - 1] > a:
                            pos[j] = pos[j - 1]
                            j -= 1
                        pos[j] = a
                        n_pos += 1
                    i = _tested(p, n, end, placed[s].access, &end)
        pos_off[m.n_words] = n_pos
        for w in range(m.n_words - 1, -1, -1):
            run[w] = run[w + 1] + 1 if w + 1 < m.n_words and _same_words(pos, pos_off, w, w + 1) else 1

        for w in range(m.n_words + 1):
            if w == m.n_words or w == 0 or w - m.chunk_w0[n_chunks - 1] == CHUNK or (
                    run[w] >= RUN and not _same_words(pos, pos_off, w - 1, w)):
                if n_chunks:  # the last chunk's
                    _order_pieces(placed, m.pieces + first, n_pieces - first,
                                  m.chunk_w0[n_chunks - 1] << 6, min(w << 6, m.n_slots), votes)
                    _bound_chunk(m, placed, n_chunks - 1, m.chunk_w0[n_chunks - 1] << 6,
                                 min(w << 6, m.n_slots))
                m.chunk_key[n_chunks] = -1
                m.chunk_w0[n_chunks] = w
                m.chunk_off[n_chunks] = first = n_pieces
                n_chunks += 1
            if w == m.n_words:
                break
            m.word_chunk[w] = n_chunks - 1
            for j in range(pos_off[w], pos_off[w + 1]):
                a = pos[j]
                k = m.columns[a].nw
                m.columns[a].nw += 1
                if piece_of[a] >= first:
                    m.pieces[piece_of[a]].k1 = k + 1
                else:
                    piece_of[a] = n_pieces
                    m.pieces[n_pieces].attr = a
                    m.pieces[n_pieces].k0 = k
                    m.pieces[n_pieces].k1 = k + 1
                    n_pieces += 1

        for a in range(n_attrs):
            m.columns[a].words = <int*>_alloc(NULL, m.columns[a].nw * sizeof(int))
            mark[a] = 0
        for w in range(m.n_words):
            for i in range(pos_off[w], pos_off[w + 1]):
                a = pos[i]
                m.columns[a].words[mark[a]] = w
                mark[a] += 1
        for i in range(n_pieces):
            k = m.pieces[i].k0
            w = m.columns[m.pieces[i].attr].words[k]
            j = m.columns[m.pieces[i].attr].words[m.pieces[i].k1 - 1]
            m.pieces[i].consecutive = j - w == m.pieces[i].k1 - 1 - k
            m.pieces[i].pk = m.columns[m.pieces[i].attr].n_pieces
            m.columns[m.pieces[i].attr].n_pieces += 1
        m.pieces = <Piece*>_alloc(m.pieces, n_pieces * sizeof(Piece))
        m.chunk_w0 = <int*>_alloc(m.chunk_w0, n_chunks * sizeof(int))
        m.chunk_off = <int*>_alloc(m.chunk_off, n_chunks * sizeof(int))
        m.chunk_key = <int*>_alloc(m.chunk_key, n_chunks * sizeof(int))
        m.chunk_lo = <double*>_alloc(m.chunk_lo, n_chunks * sizeof(double))
        m.chunk_hi = <double*>_alloc(m.chunk_hi, n_chunks * sizeof(double))
    finally:
        PyMem_Free(mark)
        PyMem_Free(piece_of)
        PyMem_Free(votes)
        PyMem_Free(pos)
        PyMem_Free(pos_off)
        PyMem_Free(run)
    m.index_bytes += (m.n_words * sizeof(int) + 3 * n_chunks * sizeof(int)
                      + 2 * n_chunks * sizeof(double)
                      + n_pieces * sizeof(Piece) + n_pos * sizeof(int))
    return 0


cdef void _bound_chunk(Matcher m, const Placed* placed, int c, int s0, int s1) noexcept:
    """Chunk c's ``chunk_key``, ``chunk_lo`` and ``chunk_hi``: where the key ranges of all
    its subscriptions (slots [s0, s1)) are on one attribute, that attribute and the hull
    of the ranges (a value outside it fails every subscription of the chunk), else -1."""
    cdef int s
    m.chunk_key[c] = -1 if s0 >= s1 or placed[s0].first == INT_MAX else placed[s0].first
    m.chunk_lo[c] = INF
    m.chunk_hi[c] = -INF
    for s in range(s0, s1):
        if placed[s].first != m.chunk_key[c]:
            m.chunk_key[c] = -1
            return
        m.chunk_lo[c] = min(m.chunk_lo[c], placed[s].lo)
        m.chunk_hi[c] = max(m.chunk_hi[c], placed[s].hi)


cdef void _order_pieces(const Placed* placed, Piece* pieces, int n, int s0, int s1,
                        int* votes) noexcept:
    """Order the ``n`` pieces of the chunk of slots [s0, s1) for the scan, which stops
    once no bit is left: first the attribute of most of its subscriptions' key ranges (they
    sit by it, so a value rules out runs of whole words at once), then by attribute.
    ``votes`` are zeros per attribute, and left so."""
    cdef int s, i, j, top = -1
    cdef Piece cur
    for s in range(s0, s1):
        if placed[s].first != INT_MAX:
            votes[placed[s].first] += 1
            if top < 0 or votes[placed[s].first] > votes[top]:
                top = placed[s].first
    for i in range(1, n):
        cur = pieces[i]
        j = i
        while j > 0 and cur.attr != pieces[j - 1].attr and (
                cur.attr == top or (pieces[j - 1].attr != top and pieces[j - 1].attr > cur.attr)):
            pieces[j] = pieces[j - 1]
            j -= 1
        pieces[j] = cur
    for s in range(s0, s1):
        if placed[s].first != INT_MAX:
            votes[placed[s].first] = 0


cdef inline bint _same_words(const int* pos, const int* pos_off, int v, int w) noexcept:
    """Whether words v and w test the same attributes."""
    cdef int i, n = pos_off[v + 1] - pos_off[v]
    if pos_off[w + 1] - pos_off[w] != n:
        return False
    for i in range(n):
        if pos[pos_off[v] + i] != pos[pos_off[w] + i]:
            return False
    return True


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
    ``sure``, count an edge if only ``may``; else write that edge at ``cursor[b]``."""
    cdef Edge* e
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
    e.lo = lo
    e.hi = hi
    e.slot = slot
    e.how = how
