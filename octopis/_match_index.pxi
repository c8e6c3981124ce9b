# Index construction (included by _match.pyx). ``_build``: each live subscription's
# access (a string lookup, or the root), the attributes its bitmaps test and its key range,
# sorted into the slot order; ``_fill_slots`` lays out slots, live bits and cells,
# ``_fill_chunks`` the attributes of each word and the chunks, ``_fill_columns`` every
# attribute's buckets, sure bitmaps and edges (in _match_columns.pxi).

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

    _free_index(m)
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
        _free_index(m)
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


cdef void _free_index(Matcher m) noexcept:
    """Free what :func:`_build` made (the subscriptions and their programs stay)."""
    cdef int a
    if m.columns != NULL:
        for a in range(m.built_attrs):
            PyMem_Free(m.columns[a].words)
            PyMem_Free(m.columns[a].split)
            PyMem_Free(m.columns[a].sids)
            PyMem_Free(m.columns[a].sure)
            PyMem_Free(m.columns[a].edge_off)
            PyMem_Free(m.columns[a].edges)
            PyMem_Free(m.columns[a].edge_at)
    PyMem_Free(m.columns)
    PyMem_Free(m.slot_sub)
    PyMem_Free(m.slot_grp)
    PyMem_Free(m.slot_key)
    m._slot_keys = []
    PyMem_Free(m.hit_w)
    PyMem_Free(m.hit_bits)
    PyMem_Free(m.live)
    PyMem_Free(m.word_chunk)
    PyMem_Free(m.chunk_w0)
    PyMem_Free(m.chunk_off)
    PyMem_Free(m.chunk_key)
    PyMem_Free(m.chunk_lo)
    PyMem_Free(m.chunk_hi)
    PyMem_Free(m.pieces)
    PyMem_Free(m.cur_sure)
    PyMem_Free(m.cur_edge)
    PyMem_Free(<void*>m.cur_at)
    PyMem_Free(m.cur_pk)
    PyMem_Free(m.str_off)
    PyMem_Free(m.cells)
    PyMem_Free(m.visit)
    PyMem_Free(m.affixed)
    m.columns = NULL
    m.slot_sub = NULL
    m.slot_grp = NULL
    m.slot_key = NULL
    m.hit_w = NULL
    m.hit_bits = NULL
    m.live = NULL
    m.word_chunk = NULL
    m.chunk_w0 = NULL
    m.chunk_off = NULL
    m.chunk_key = NULL
    m.chunk_lo = NULL
    m.chunk_hi = NULL
    m.pieces = NULL
    m.cur_sure = NULL
    m.cur_edge = NULL
    m.cur_at = NULL
    m.cur_pk = NULL
    m.str_off = NULL
    m.cells = NULL
    m.visit = NULL
    m.affixed = NULL
    m.built_attrs = 0
    m.built_strs = 0
    m.n_slots = m.n_words = m.n_cells = m.root_end = 0
    m.index_bytes = 0
    m._affix_lengths = {}
