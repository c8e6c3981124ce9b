# Matching (included by _match.pyx): load a publication into the value slots, look up
# the access structures, verify the residual programs, collect keys or groups.

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


cdef int _load(Matcher m, dict publication, list keep) except -1:
    """Clear the slots of the previous publication and fill them from this one; the
    attributes that count (known, of a supported type) end up in ``touched``."""
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
    cdef int a = p.attr, op = p.op, c
    cdef Py_ssize_t la
    cdef const char* s
    if m.v_epoch[a] != m.epoch:
        return False
    if op == PRESENT:
        return True
    if op == NUM_NE:
        return m.v_kind[a] == KIND_NUM and m.val[2 * a] != p.lo
    if m.v_kind[a] != KIND_STR:
        return False
    if op == STR_NE:
        return m.v_sid[a] != p.sid
    s = m.v_str[a]
    la = m.v_len[a]
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


cdef inline int _emit(Matcher m, Hot h, int sub, const Res* r, int n_out) noexcept:
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
        ok = _holds(m, m.slow + r.slow, r.nslow)
    return _take(h, sub, ok, n_out)


cdef inline int _lookup(Matcher m, Hot h, int sid, int key, int n_out) noexcept:
    """Candidates of the string lookup (sid, key)."""
    cdef int j, end, first
    cdef const Ent* e
    if sid < 0 or sid >= m.built_strs:
        return n_out
    j = m.str_off[sid]
    end = m.str_off[sid + 1]
    while j < end and m.str_ent[j].key < key:
        j += 1
    first = j
    while j < end and m.str_ent[j].key == key and n_out < h.stop:
        e = &m.str_ent[j]
        n_out = _emit(m, h, e.sub, &e.res, n_out)
        j += 1
    m.candidates += j - first
    return n_out


cdef int _affix_lookups(Matcher m, Hot h, int a, int n_out) except -1:
    """Candidates of the prefix and postfix lookups of string attribute ``a``."""
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
    cdef int n_touched, t, a, i, end, node, n_out = 0
    cdef long long n_cand = 0
    cdef double v
    cdef const Node* nd
    cdef const Bound* bounds
    cdef Hot h
    n_touched = _load(m, publication, keep)
    h.fast = m.fast
    h.val = m.val
    h.state = m.state
    h.out = m.out
    h.grp = m.grp if groups else NULL
    h.seen = m.seen
    h.stop = m.n_groups if groups else INT_MAX
    for t in range(n_touched):
        a = m.touched[t]
        if a >= m.built_attrs:
            continue
        if m.v_kind[a] == KIND_NUM:
            v = h.val[2 * a]
            node = -1 if isnan(v) else m.iv_root[a]
            while node >= 0 and n_out < h.stop:
                nd = &m.nodes[node]
                i = nd.beg
                if v < nd.center:
                    bounds = m.by_lo
                    while i < nd.end and bounds[i].v <= v and n_out < h.stop:
                        n_out = _emit(m, h, bounds[i].sub, &bounds[i].res, n_out)
                        i += 1
                    node = nd.left
                elif v > nd.center:
                    bounds = m.by_hi
                    while i < nd.end and bounds[i].v >= v and n_out < h.stop:
                        n_out = _emit(m, h, bounds[i].sub, &bounds[i].res, n_out)
                        i += 1
                    node = nd.right
                else:
                    bounds = m.by_lo
                    while i < nd.end and n_out < h.stop:
                        n_out = _emit(m, h, bounds[i].sub, &bounds[i].res, n_out)
                        i += 1
                    node = -1
                n_cand += i - nd.beg
        else:
            n_out = _lookup(m, h, m.v_sid[a], 3 * a + BY_EQ, n_out)
            if m.affixed[a]:
                n_out = _affix_lookups(m, h, a, n_out)
        end = m.pr_off[a + 1]
        i = m.pr_off[a]
        while i < end and n_out < h.stop:
            n_out = _emit(m, h, m.pr_ent[i].sub, &m.pr_ent[i].res, n_out)
            i += 1
        n_cand += i - m.pr_off[a]
        if n_out >= h.stop:
            break
    m.candidates += n_cand
    t = 0
    while t < m.n_pending and n_out < h.stop:
        i = m.pending[t]
        n_out = _take(h, i, _holds(m, m.prog[i], m.prog_len[i]), n_out)
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
