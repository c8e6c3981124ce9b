# Matching (included by _match.pyx): load a publication into the value slots and its
# bucket in every column, scan the root and the cells its strings look up, verify the
# undecided bits, collect keys or groups.

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
            _aim(m, aid, m.columns[aid].n_num + m.columns[aid].n_str + 2)
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


cdef inline void _aim(Matcher m, int a, int b) noexcept:
    """Point column a at its bucket b."""
    cdef const Column* c = &m.columns[a]
    m.cur_may[a] = c.bits + 2 * <Py_ssize_t>b * c.nw
    m.cur_sure[a] = c.bits + (2 * <Py_ssize_t>b + 1) * c.nw


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
    if h.grp != NULL:
        if g < 0 or h.seen[g]:
            return n_out
        h.seen[g] = 1
    h.out[n_out] = sub
    return n_out + 1


cdef int _scan(Matcher m, Hot* h, int s0, int s1, int n_out) noexcept:
    """Matches among the slots [s0, s1) into ``h.out``: per block of words, the live bits
    ANDed with the may and the sure bitmaps of the publication's buckets of the segment's
    columns; sure bits match, the other may bits are verified."""
    cdef uint64_t may[BLOCK]
    cdef uint64_t sure[BLOCK]
    cdef uint64_t bits
    cdef const uint64_t* pm
    cdef const uint64_t* ps
    cdef const Seg* seg
    cdef int w, last, end, n, i, j, off, slot, sub, g
    if s0 >= s1:
        return n_out
    w = s0 >> 6
    last = (s1 - 1) >> 6
    while w <= last and n_out < h.stop:
        seg = &h.segs[h.word_seg[w]]
        end = min(seg.w1, last + 1, w + BLOCK)
        n = end - w
        for i in range(n):
            may[i] = h.live[w + i]
        if w == s0 >> 6:
            may[0] &= (~(<uint64_t>0)) << (s0 & 63)
        if end - 1 == last and s1 & 63:
            may[n - 1] &= ((<uint64_t>1) << (s1 & 63)) - 1
        for i in range(n):
            sure[i] = may[i]
        for j in range(seg.c0, seg.c1):
            off = h.cols[j].k + w - seg.w0
            pm = h.cur_may[h.cols[j].attr] + off
            ps = h.cur_sure[h.cols[j].attr] + off
            for i in range(n):
                may[i] &= pm[i]
                sure[i] &= ps[i]
        for i in range(n):
            bits = sure[i]
            while bits:
                slot = ((w + i) << 6) + _ctz(bits)
                n_out = _take(h, h.slot_sub[slot], h.grp[slot] if h.grp != NULL else 0, n_out)
                if n_out >= h.stop:
                    return n_out
                bits &= bits - 1
            bits = may[i] & ~sure[i]
            while bits:
                slot = ((w + i) << 6) + _ctz(bits)
                bits &= bits - 1
                g = 0
                if h.grp != NULL:
                    g = h.grp[slot]
                    if g < 0 or h.seen[g]:
                        continue
                sub = h.slot_sub[slot]
                m.candidates += 1
                if _holds(m, m.prog[sub], m.prog_len[sub]):
                    n_out = _take(h, sub, g, n_out)
                    if n_out >= h.stop:
                        return n_out
        w = end
    return n_out


cdef inline int _lookup(Matcher m, Hot* h, int sid, int key, int n_out) noexcept:
    """Scan the cell of the string lookup (sid, key), if there is one."""
    cdef int j
    if sid < 0 or sid >= m.built_strs:
        return n_out
    for j in range(m.str_off[sid], m.str_off[sid + 1]):
        if m.cells[j].key == key:
            return _scan(m, h, m.cells[j].beg, m.cells[j].end, n_out)
    return n_out


cdef int _affix_lookups(Matcher m, Hot* h, int a, int n_out) except -1:
    """Scan the cells of the prefix and postfix lookups of string attribute ``a``."""
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
            n_out = _lookup(m, h, <int>(<object>found), 3 * a + BY_PREFIX, n_out)
    for size in postfixes:
        if size > length:
            break
        found = PyDict_GetItemWithError(m._str_ids, value[length - size:])
        if found != NULL:
            n_out = _lookup(m, h, <int>(<object>found), 3 * a + BY_POSTFIX, n_out)
    return n_out


cdef int _collect(Matcher m, dict publication, list keep, bint groups) except -1:
    """Internal ids of the matching subscriptions into ``m.out``; returns how many.
    ``keep`` holds the publication's values alive while ``out`` is in use.

    With ``groups``, ``out`` gets one matching subscription per group instead, with
    its group marked in ``seen``, and the search stops as soon as every group with a
    live subscription has one (Algorithm 3 needs distinct next hops, not every match).
    """
    cdef int n_touched, t, a, i, n_out
    cdef Hot h
    n_touched = _load(m, publication, keep)
    h.live = m.live
    h.slot_sub = m.slot_sub
    h.grp = m.slot_grp if groups else NULL
    h.word_seg = m.word_seg
    h.segs = m.segs
    h.cols = m.cols
    h.cur_may = m.cur_may
    h.cur_sure = m.cur_sure
    h.seen = m.seen
    h.out = m.out
    h.stop = m.n_groups if groups else INT_MAX
    n_out = _scan(m, &h, 0, m.root_end, 0)
    for t in range(n_touched):
        a = m.touched[t]
        if n_out >= h.stop:
            break
        if a >= m.built_attrs or m.v_kind[a] != KIND_STR:
            continue
        n_out = _lookup(m, &h, m.v_sid[a], 3 * a + BY_EQ, n_out)
        if m.affixed[a]:
            n_out = _affix_lookups(m, &h, a, n_out)
    t = 0
    while t < m.n_pending and n_out < h.stop:
        i = m.pending[t]
        if _holds(m, m.prog[i], m.prog_len[i]):
            n_out = _take(&h, i, m.grp[i], n_out)
        t += 1
    return n_out


cdef list _match_one(Matcher m, dict publication):
    cdef int i
    cdef list keep = []
    cdef list keys
    cdef PyObject* key
    cdef int n_out = _collect(m, publication, keep, False)
    # The keys' reference counts are scattered in memory: fetch them ahead of use.
    keys = m._keys
    result = PyList_New(n_out)
    for i in range(min(n_out, 8)):
        _prefetch(_list_item(keys, m.out[i]), 1, 3)
    for i in range(n_out):
        if i + 8 < n_out:
            _prefetch(_list_item(keys, m.out[i + 8]), 1, 3)
        key = _list_item(keys, m.out[i])
        _incref(key)
        _list_set(result, i, key)
    return result
