# Matching (included by _match.pyx): load a publication into the value slots and its
# bucket in every column, scan the root and the cells its strings look up (deciding the
# edges on the way), collect keys or groups.

def is_plain_publication(object publication, set known):
    """Whether ``publication`` is a non-empty dict whose names are all in ``known`` and
    whose values are strings, finite floats or integers within ±2**53 (never ``bool``):
    the common case of :func:`octopis.filters.language.validate_publication`, decided in C on every
    hop. False means "not known to be valid": the Python check then decides and words
    the error."""
    return _plain(publication, known)


def plain_notification(
    bytes head, decoder, tuple errors, set known, type cls, Py_ssize_t publication, bytes body
):
    """A ``cls`` (a subclass of tuple) from a plain NOTIFY ``body``, or None: when
    ``body`` starts with ``head``, ``decoder(body)`` is a tuple ``(kind, *fields)`` and
    ``fields[publication]`` (its position in the tuple, ``octopis.wire.NotifyBody``'s
    declaration gives it) is plain (:func:`is_plain_publication`), the fields after the
    kind, in one allocation. None means "not the plain shape" (``decoder`` raised one of
    ``errors``, or the shape differs): the full decoding then decides and words any
    error. The arguments before ``body`` are meant to be bound once
    (``functools.partial``)."""
    cdef Py_ssize_t size = PyBytes_GET_SIZE(head)
    cdef Py_ssize_t i
    if not PyType_IsSubtype(cls, tuple):
        raise TypeError(f"{cls.__name__} is not a tuple type")
    if publication < 1:
        raise ValueError(f"a publication's position must follow the kind, not {publication}")
    if PyBytes_GET_SIZE(body) < size or memcmp(
        PyBytes_AS_STRING(body), PyBytes_AS_STRING(head), size
    ):
        return None
    try:
        fields = decoder(body)
    except errors:
        return None
    if type(fields) is not tuple:
        return None
    size = len(fields)
    if size <= publication or not _plain(fields[publication], known):
        return None
    record = PyType_GenericAlloc(cls, size - 1)
    for i in range(1, size):
        item = fields[i]
        Py_INCREF(item)
        PyTuple_SET_ITEM(record, i - 1, item)
    return record


cdef bint _plain(object publication, set known) except -1:
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


cdef int _load(Matcher m, dict publication, list keep) except -1:
    """Clear the slots of the previous publication and fill them from this one; the
    attributes that count (known, of a supported type) end up in ``touched``, and every
    column points at the publication's bucket (absent for the attributes it lacks)."""
    cdef int t, aid
    cdef char kind
    cdef PyObject* found
    cdef Py_ssize_t size
    cdef const char* data
    cdef double num = 0.0
    for t in range(m.n_loaded):
        aid = m.touched[t]
        m.val[2 * aid] = NAN
        m.val[2 * aid + 1] = NAN
        if aid < m.built_attrs:
            _aim(m, aid, _absent(&m.columns[aid]))
    m.n_loaded = 0
    m.epoch += 1
    if m.epoch == 0:
        if m.acap > 0:
            memset(m.v_epoch, 0, m.acap * sizeof(uint32_t))
        m.epoch = 1
    for attr, value in publication.items():
        found = PyDict_GetItemWithError(m._attr_ids, attr)
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
        m.touched[m.n_loaded] = aid
        m.n_loaded += 1
        m.v_epoch[aid] = m.epoch
        m.v_kind[aid] = kind
        if kind == KIND_NUM:
            m.val[2 * aid] = num
            continue
        found = PyDict_GetItemWithError(m._str_ids, value)
        m.v_sid[aid] = -1 if found == NULL else <int>(<object>found)
        m.val[2 * aid + 1] = m.v_sid[aid]
        try:
            data = PyUnicode_AsUTF8AndSize(value, &size)
        except UnicodeEncodeError:
            encoded = (<str>value).encode("utf-8", "surrogatepass")
            keep.append(encoded)
            data = PyBytes_AS_STRING(encoded)
            size = PyBytes_GET_SIZE(encoded)
        m.v_str[aid] = data
        m.v_len[aid] = size
        m.v_obj[aid] = <PyObject*>value
    for t in range(m.n_loaded):
        aid = m.touched[t]
        if aid < m.built_attrs:
            _aim(m, aid, _bucket(m, aid))
    return m.n_loaded


cdef inline bint _holds(Matcher m, const Pred* p, int n) noexcept:
    """Whether the loaded publication satisfies all ``n`` predicates at ``p``."""
    cdef int i, a
    cdef bint ok = True
    cdef double x
    for i in range(n):
        a = p[i].attr
        if p[i].op == NUM_RANGE:
            x = m.val[2 * a]
            ok &= (p[i].lo <= x) & (x <= p[i].hi)
        elif p[i].op == STR_EQ:
            ok &= m.val[2 * a + 1] == p[i].sid
        elif not _holds_other(m, &p[i]):
            return False
    return ok


cdef bint _holds_other(Matcher m, const Pred* p) noexcept:
    """One predicate that is neither a range nor a string equality."""
    cdef int a = p.attr
    if m.v_epoch[a] != m.epoch:
        return False
    if p.op == PRESENT:
        return True
    if p.op == NUM_NE:
        return m.v_kind[a] == KIND_NUM and m.val[2 * a] != p.lo
    return m.v_kind[a] == KIND_STR and _str_holds(p, m.v_sid[a], m.v_str[a], m.v_len[a])


cdef inline int _absent(const Column* c) noexcept:
    return c.n_num + c.n_str + 2


cdef inline void _aim(Matcher m, int a, int b) noexcept:
    """Point column a at its bucket b: its sure bits and its first edge."""
    cdef const Column* c = &m.columns[a]
    m.cur_sure[a] = c.sure + <Py_ssize_t>b * c.nw
    m.cur_edge[a] = c.edges + c.edge_off[b]
    m.cur_at[a] = c.edge_at + <Py_ssize_t>b * c.n_pieces
    m.cur_pk[a] = -1


cdef inline bint _edge_holds(Matcher m, const Edge* e, int a) noexcept:
    """Whether the predicates on attribute a of the live subscription of edge ``e`` (not
    an EDGE_GE or EDGE_LE, which the scan checks inline) hold for the loaded publication."""
    if e.how == EDGE_SID:
        return e.bound == m.val[2 * a + 1]
    return _holds_on(m, m.slot_sub[e.slot], a)


cdef bint _holds_on(Matcher m, int sub, int a) noexcept:
    """Whether the predicates of ``sub`` on attribute a hold for the loaded publication."""
    cdef const Pred* p = m.prog[sub]
    cdef int n = m.prog_len[sub], i = 0, j
    while i < n and p[i].attr != a:
        i += 1
    j = i
    while j < n and p[j].attr == a:
        j += 1
    return _holds(m, p + i, j - i)


cdef inline int _bucket(Matcher m, int a) noexcept:
    """The bucket of column a that holds the loaded value of a."""
    cdef const Column* c = &m.columns[a]
    cdef double x
    if m.v_kind[a] == KIND_NUM:
        x = m.val[2 * a]
        return c.n_num if isnan(x) else _upper(c.split, c.n_num - 1, x)
    return c.n_num + 1 + _find(c.sids, c.n_str, m.v_sid[a])


cdef inline int _take(Hot* h, int sub, int g, int n_out) noexcept:
    """Append ``sub`` (a match, of group ``g``) to ``h.out`` unless, in group mode, it has
    no group or its group has a subscription there already; returns the new length."""
    if h.groups:
        if g < 0 or h.seen[g]:
            return n_out
        h.seen[g] = 1
        h.out_grp[n_out] = g
    h.out[n_out] = sub
    return n_out + 1


cdef inline uint64_t _and_piece(Matcher m, Hot* h, const Piece* piece, int w, int n,
                                int lim, uint64_t* acc) noexcept:
    """AND a column's piece into ``acc``, the words [w, w + n) of a chunk: the sure bits of
    the publication's bucket and those of its edges (below slot ``lim``) that hold for
    subscriptions still in ``acc``; returns whether any bit is left."""
    cdef uint64_t passed[CHUNK]
    cdef uint64_t any = 0, bit
    cdef int i, d, k = piece.k0, k1 = piece.k1, a = piece.attr
    cdef const int* words = h.columns[a].words
    cdef const uint64_t* sure = h.cur_sure[a]
    cdef const Edge* e = h.cur_edge[a]
    cdef const Edge* at
    cdef const Edge* first
    cdef double x[2]
    cdef bint tested = 0
    while k < k1 and words[k] < w:  # a scan that starts or ends inside the chunk
        k += 1
    while k1 > k and words[k1 - 1] >= w + n:
        k1 -= 1
    if piece.pk != h.cur_pk[a] + 1:  # chunks skipped since the cursor's last piece
        at = h.columns[a].edges + h.cur_at[a][piece.pk]
        if at > e:
            e = at
    while e.slot < w << 6:  # and of the words skipped in this one
        e += 1
    if e.slot < lim:
        tested = 1
        memset(passed, 0, n * sizeof(uint64_t))
        first = e
        x[EDGE_GE] = m.val[2 * a]
        x[EDGE_LE] = -x[EDGE_GE]
        while e.slot < lim:
            i = (e.slot >> 6) - w
            bit = acc[i] & ((<uint64_t>1) << (e.slot & 63))
            if e.how <= EDGE_LE:
                passed[i] |= bit & -<uint64_t>(e.bound <= x[e.how])
            elif bit and _edge_holds(m, e, a):
                passed[i] |= bit
            e += 1
        h.candidates += e - first
    if piece.consecutive and k < k1:
        d = words[k] - w
        sure += k - d
        if tested:
            for i in range(d, d + k1 - k):
                acc[i] &= sure[i] | passed[i]
        else:
            for i in range(d, d + k1 - k):
                acc[i] &= sure[i]
    elif tested:
        for i in range(k, k1):
            d = words[i] - w
            acc[d] &= sure[i] | passed[d]
    else:
        for i in range(k, k1):
            acc[words[i] - w] &= sure[i]
    h.cur_edge[a] = <Edge*>e
    if h.prefetch:  # the column's next edges, which its next piece reads
        _prefetch(<const char*>e + 64, 0, 3)
        _prefetch(<const char*>e + 128, 0, 3)
    if lim >= (words[piece.k1 - 1] + 1) << 6:  # the cursor is past all the piece's edges
        h.cur_pk[a] = piece.pk
    for i in range(n):
        any |= acc[i]
    return any


cdef inline bint _outside(const Hot* h, int c) noexcept:
    """Whether the publication fails every subscription of chunk c on the attribute of
    their key ranges (the hull of the ranges does not hold its value, or it has none)."""
    cdef int a = h.chunk_key[c]
    return a >= 0 and not (h.chunk_lo[c] <= h.val[2 * a] <= h.chunk_hi[c])


cdef inline void _prefetch_chunk(const Hot* h, int c) noexcept:
    """Ask the cache for what chunk c will read of the publication's buckets: the sure
    words of each piece, and its first edge where the column's cursor is, else the entry
    of the edge index that says where it is (with a large index they come from memory,
    and each chunk reads a few lines of each column only). Reading that entry here to ask
    for the edge itself waited on memory: it was slower."""
    cdef int j, k
    cdef const Piece* piece
    for j in range(h.chunk_off[c], h.chunk_off[c + 1]):
        piece = &h.pieces[j]
        for k in range(piece.k0, piece.k1, 8):
            _prefetch(h.cur_sure[piece.attr] + k, 0, 3)
        if piece.pk == h.cur_pk[piece.attr] + 1:
            _prefetch(h.cur_edge[piece.attr], 0, 3)
        else:
            _prefetch(h.cur_at[piece.attr] + piece.pk, 0, 3)


cdef int _scan(Matcher m, Hot* h, int s0, int s1, int n_out) noexcept:
    """Matches among the slots [s0, s1) into ``h.out``: per chunk, the live bits ANDed
    with every column's piece. Scans must come in slot order (edges are consumed)."""
    cdef uint64_t acc[CHUNK]
    cdef uint64_t bits
    cdef int w, last, end, n, i, j, c, slot, lim, g, ahead = -1
    if s0 >= s1:
        return n_out
    w = s0 >> 6
    last = (s1 - 1) >> 6
    while w <= last and n_out < h.stop:
        c = h.word_chunk[w]
        end = min(h.chunk_w0[c + 1], last + 1)
        n = end - w
        lim = min(end << 6, s1)  # edges of later slots are left to later scans
        if _outside(h, c):
            w = end
            continue
        if h.prefetch:
            if ahead != c and n >= CHUNK // 4:  # what this chunk reads is not on its way
                _prefetch_chunk(h, c)
            if end <= last and not _outside(h, c + 1):
                _prefetch_chunk(h, c + 1)
                ahead = c + 1
        for i in range(n):
            acc[i] = h.live[w + i]
        if w == s0 >> 6:
            acc[0] &= (~(<uint64_t>0)) << (s0 & 63)
        if end - 1 == last and s1 & 63:
            acc[n - 1] &= ((<uint64_t>1) << (s1 & 63)) - 1
        for j in range(h.chunk_off[c], h.chunk_off[c + 1]):
            if not _and_piece(m, h, &h.pieces[j], w, n, lim, acc):
                break
        if not h.groups:  # written whether or not they hold a match, kept if they do
            j = h.n_hit  # (match() counts their bits once the scans are done)
            for i in range(n):
                h.hit_w[j] = w + i
                h.hit_bits[j] = acc[i]
                j += acc[i] != 0
            h.n_hit = j
            w = end
            continue
        for i in range(n):
            bits = acc[i]
            while bits:
                slot = ((w + i) << 6) + _ctz(bits)
                bits &= bits - 1
                g = h.grp[slot]
                if g < 0 or h.seen[g]:
                    continue
                n_out = _take(h, h.slot_sub[slot], g, n_out)
                if n_out >= h.stop:
                    return n_out
        w = end
    return n_out


cdef inline void _lookup(Matcher m, int sid, int key, int* n_visit) noexcept:
    """Add the cell of the string lookup (sid, key), if there is one, to ``visit``."""
    cdef int j
    if sid < 0 or sid >= m.built_strs:
        return
    for j in range(m.str_off[sid], m.str_off[sid + 1]):
        if m.cells[j].key == key:
            m.visit[n_visit[0]] = j
            n_visit[0] += 1
            return


cdef int _affix_lookups(Matcher m, int a, int* n_visit) except -1:
    """Add the cells of the prefix and postfix lookups of string attribute ``a``."""
    cdef Py_ssize_t length
    cdef int size
    cdef PyObject* found
    value = <str>m.v_obj[a]
    length = len(value)
    prefixes, postfixes = m._affix_lengths[a]
    for size in prefixes:
        if size > length:
            break
        found = PyDict_GetItemWithError(m._str_ids, value[:size])
        if found != NULL:
            _lookup(m, <int>(<object>found), 3 * a + BY_PREFIX, n_visit)
    for size in postfixes:
        if size > length:
            break
        found = PyDict_GetItemWithError(m._str_ids, value[length - size:])
        if found != NULL:
            _lookup(m, <int>(<object>found), 3 * a + BY_POSTFIX, n_visit)
    return 0


cdef int _collect(Matcher m, dict publication, list keep, bint groups) except -1:
    """The matching subscriptions. The indexed ones are left as words of slots in
    ``m.hit_w`` and ``m.hit_bits`` (``m.n_hit`` of them), the pending ones as internal
    ids in ``m.out``; returns how many pending ones match (the bits are counted by the
    caller). ``keep`` holds the publication's values alive while the results are in use.

    With ``groups``, ``out`` gets one matching subscription per group instead (and
    ``out_grp`` its group, marked in ``seen``), and the search stops as soon as every
    group with a live subscription has one (Algorithm 3 needs distinct next hops, not
    every match).
    """
    cdef int n_touched, t, a, i, j, n_out, n_visit = 0
    cdef Hot h
    n_touched = _load(m, publication, keep)
    for t in range(n_touched):
        a = m.touched[t]
        if a < m.built_attrs and m.v_kind[a] == KIND_STR:
            _lookup(m, m.v_sid[a], 3 * a + BY_EQ, &n_visit)
            if m.affixed[a]:
                _affix_lookups(m, a, &n_visit)
    for i in range(1, n_visit):  # the cells in slot order, after the root
        t = m.visit[i]
        j = i
        while j > 0 and m.visit[j - 1] > t:
            m.visit[j] = m.visit[j - 1]
            j -= 1
        m.visit[j] = t
    h.live = m.live
    h.slot_sub = m.slot_sub
    h.grp = m.slot_grp
    h.groups = groups
    h.word_chunk = m.word_chunk
    h.chunk_w0 = m.chunk_w0
    h.chunk_off = m.chunk_off
    h.chunk_key = m.chunk_key
    h.chunk_lo = m.chunk_lo
    h.chunk_hi = m.chunk_hi
    h.val = m.val
    h.pieces = m.pieces
    h.columns = m.columns
    h.cur_sure = m.cur_sure
    h.cur_edge = m.cur_edge
    h.cur_at = m.cur_at
    h.cur_pk = m.cur_pk
    h.seen = m.seen
    h.out = m.out
    h.out_grp = m.out_grp
    h.hit_w = m.hit_w
    h.hit_bits = m.hit_bits
    h.n_hit = 0
    h.candidates = 0
    h.stop = m.n_groups if groups else INT_MAX
    h.prefetch = m.index_bytes >= PREFETCH_BYTES
    n_out = _scan(m, &h, 0, m.root_end, 0)
    for i in range(n_visit):
        if n_out >= h.stop:
            break
        n_out = _scan(m, &h, m.cells[m.visit[i]].beg, m.cells[m.visit[i]].end, n_out)
    m.n_hit = h.n_hit
    m.candidates += h.candidates
    if not groups:
        j = 0
        for t in range(m.n_pending):
            i = m.pending[t]
            if _holds(m, m.prog[i], m.prog_len[i]):
                m.out[j] = i
                j += 1
        return j  # the scans counted nothing: no early stop without groups
    t = 0
    while t < m.n_pending and n_out < h.stop:
        i = m.pending[t]
        if _holds(m, m.prog[i], m.prog_len[i]):
            n_out = _take(&h, i, m.grp[i], n_out)
        t += 1
    return n_out


cdef enum:
    LAG = 48  # keys between asking for a key's line and taking its reference


cdef list _match_one(Matcher m, dict publication):
    cdef int i, j = 0, t, base, n_out, n_index, n_pending
    cdef uint64_t bits
    cdef list keep = []
    cdef list result
    cdef PyObject** items
    cdef const int* hit_w
    cdef const uint64_t* hit_bits
    cdef PyObject** slot_key
    n_pending = _collect(m, publication, keep, False)
    hit_w = m.hit_w
    hit_bits = m.hit_bits
    slot_key = m.slot_key
    n_out = <int>_count_bits(hit_bits, m.n_hit) + n_pending
    result = _list_unfilled(n_out)  # every item is stored below, before any Python code
    items = _list_items(result)
    # Every key from slot_key (read in slot order, independent loads), asking for its line
    # as it comes and taking the reference to the key read LAG keys before, whose line has
    # had time to come and is still in the nearest cache (no Python code runs while the
    # list holds borrowed keys). A first pass reading every key, then a second taking
    # every reference, was slower: with thousands of keys their lines had left that cache.
    for t in range(m.n_hit):
        base = hit_w[t] << 6
        bits = hit_bits[t]
        while bits:
            items[j] = slot_key[base + _ctz(bits)]
            _prefetch(items[j], 1, 3)
            if j >= LAG:
                _incref(items[j - LAG])
            j += 1
            bits &= bits - 1
    n_index = j
    for i in range(max(0, n_index - LAG), n_index):
        _incref(items[i])
    for i in range(n_out - n_index):
        items[n_index + i] = _list_item(m._keys, m.out[i])
        _incref(items[n_index + i])
    return result
