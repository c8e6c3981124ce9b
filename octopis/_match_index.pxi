# Index construction (included by _match.pyx). ``_build``: the constants' distribution
# per attribute, then each live subscription's access predicate and residual program;
# ``_fill_strings``, ``_fill_presence`` and ``_fill_intervals`` lay out the three access
# structures, each entry followed by its copy of the residual program (``_place``).

cdef int _build(Matcher m) except -1:
    cdef int i, j, n, a, sub, n_str, n_iv, n_pr, n_mres, n_num, n_keys
    cdef int best, best_at, end, total = 0, n_never = 0
    cdef int n_attrs = len(m._attr_refs)
    cdef int n_strs = len(m._str_refs)
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
    cdef Residuals res
    res.n_fast = res.n_slow = 0

    m._free_index()
    for sub in range(m.n_ids):
        if m.state[sub] == DEAD:
            m.state[sub] = FREE
            m._free.append(sub)
        elif m.state[sub] == LIVE:
            total += m.prog_len[sub]
    try:
        # The constants of all subscriptions stand for the values of each attribute:
        # numeric constants per attribute (sorted), string keys (3·attr + kind, sid).
        nums = <NumStat*>_alloc(NULL, 2 * total * sizeof(NumStat))
        keys = <int64_t*>_alloc(NULL, total * sizeof(int64_t))
        key_total = <int*>_alloc(NULL, 3 * n_attrs * sizeof(int))
        memset(key_total, 0, 3 * n_attrs * sizeof(int))
        n_num = n_keys = 0
        for sub in range(m.n_ids):
            if m.state[sub] != LIVE:
                continue
            p = m.prog[sub]
            for i in range(m.prog_len[sub]):
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
        mres_beg = <int*>_alloc(NULL, m.n_ids * sizeof(int))
        mres_len = <int*>_alloc(NULL, m.n_ids * sizeof(int))
        str_tmp = <Ent*>_alloc(NULL, m.n_live * sizeof(Ent))
        pr_tmp = <Ent*>_alloc(NULL, m.n_live * sizeof(Ent))
        ivs = <Ival*>_alloc(NULL, m.n_live * sizeof(Ival))
        n_str = n_iv = n_pr = n_mres = 0
        for sub in range(m.n_ids):
            m.indexed[sub] = m.state[sub] == LIVE
            if m.state[sub] != LIVE:
                continue
            p = m.prog[sub]
            n = m.prog_len[sub]
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
                            est = _estimate(m, q, num_off, num_vals, keys, n_keys,
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
                est = _estimate(m, q, num_off, num_vals, keys, n_keys, key_total)
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
        m.fast = <Rng*>_alloc(NULL, (n_mres + 1) * 2 * sizeof(Rng))
        m.slow = <Pred*>_alloc(NULL, (n_mres + 1) * 2 * sizeof(Pred))

        res.preds, res.beg, res.length = mres, mres_beg, mres_len
        counts = _fill_strings(m, str_tmp, n_str, n_strs, n_attrs, &res)
        str_tmp = NULL  # the index owns it now
        _fill_presence(m, pr_tmp, n_pr, n_attrs, &res)
        pr_tmp = NULL
        _fill_intervals(m, ivs, n_iv, n_attrs, &res)

        m.built_attrs = n_attrs
        m.built_strs = n_strs
        m.n_pending = 0
        m.n_indexed = m.n_live
        m.n_dead = 0
        m._stats.update(
            rebuilds=m._stats["rebuilds"] + 1, equality=counts[0], prefix=counts[1],
            postfix=counts[2], interval=n_iv, presence=n_pr, never=n_never)
    except BaseException:
        m._free_index()
        m.n_pending = m.n_indexed = m.n_dead = 0
        for sub in range(m.n_ids):
            m.indexed[sub] = 0
            if m.state[sub] == LIVE:
                m.pend_pos[sub] = m.n_pending
                m.pending[m.n_pending] = sub
                m.n_pending += 1
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
    return 0


cdef list _fill_strings(Matcher m, Ent* str_tmp, int n_str, int n_strs, int n_attrs,
                        Residuals* res):
    """String lookups: entries grouped by sid, then key; the index takes ``str_tmp``.
    Returns the entries of each kind (equality, prefix, postfix)."""
    cdef int i, a, kind
    qsort(str_tmp, n_str, sizeof(Ent), _cmp_ent)
    m.str_off = <int*>_alloc(NULL, (n_strs + 1) * sizeof(int))
    memset(m.str_off, 0, (n_strs + 1) * sizeof(int))
    m.affixed = <char*>_alloc(NULL, n_attrs * sizeof(char))
    memset(m.affixed, 0, n_attrs)
    counts = [0, 0, 0]
    affixes = {}
    for i in range(n_str):
        m.str_off[str_tmp[i].sid + 1] += 1
        _place(m, &str_tmp[i].res, str_tmp[i].sub, res)
        kind = str_tmp[i].key % 3
        counts[kind] += 1
        if kind != BY_EQ:
            a = str_tmp[i].key // 3
            m.affixed[a] = 1
            affixes.setdefault((a, kind), set()).add(len(m._str_text[str_tmp[i].sid]))
    for i in range(n_strs):
        m.str_off[i + 1] += m.str_off[i]
    for (a, kind), lengths in affixes.items():
        prefixes, postfixes = m._affix_lengths.get(a, ((), ()))
        if kind == BY_PREFIX:
            prefixes = tuple(sorted(lengths))
        else:
            postfixes = tuple(sorted(lengths))
        m._affix_lengths[a] = (prefixes, postfixes)
    m.str_ent = str_tmp
    return counts


cdef int _fill_presence(Matcher m, Ent* pr_tmp, int n_pr, int n_attrs,
                        Residuals* res) except -1:
    """Presence: entries grouped by attribute; the index takes ``pr_tmp``."""
    cdef int i
    qsort(pr_tmp, n_pr, sizeof(Ent), _cmp_ent)
    m.pr_off = <int*>_alloc(NULL, (n_attrs + 1) * sizeof(int))
    memset(m.pr_off, 0, (n_attrs + 1) * sizeof(int))
    for i in range(n_pr):
        m.pr_off[pr_tmp[i].key + 1] += 1
        _place(m, &pr_tmp[i].res, pr_tmp[i].sub, res)
    for i in range(n_attrs):
        m.pr_off[i + 1] += m.pr_off[i]
    m.pr_ent = pr_tmp
    return 0


cdef int _fill_intervals(Matcher m, Ival* ivs, int n_iv, int n_attrs,
                         Residuals* res) except -1:
    """Intervals: per attribute, the rays [c, inf] in a node centred at +inf, whose left
    child holds the rays [-inf, c] centred at -inf, whose right child is a centred
    interval tree of the bounded intervals."""
    cdef int i, j, k, a, n_up, n_down, node, n_nodes, beg
    cdef Ival cur
    cdef Ival* iv_tmp = NULL
    cdef double* pts = NULL
    try:
        qsort(ivs, n_iv, sizeof(Ival), _cmp_ival)
        m.iv_root = <int*>_alloc(NULL, n_attrs * sizeof(int))
        for a in range(n_attrs):
            m.iv_root[a] = -1
        m.nodes = <Node*>_alloc(NULL, n_iv * sizeof(Node))
        m.by_lo = <Bound*>_alloc(NULL, n_iv * sizeof(Bound))
        m.by_hi = <Bound*>_alloc(NULL, n_iv * sizeof(Bound))
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
            node = _tree(m, ivs + i + n_up + n_down, j - i - n_up - n_down, iv_tmp, pts,
                         &n_nodes, &beg)
            if n_down:
                node = _node(m, ivs + i + n_up, n_down, -INF, -1, node, &n_nodes, &beg)
            if n_up:
                node = _node(m, ivs + i, n_up, INF, node, -1, &n_nodes, &beg)
            m.iv_root[ivs[i].attr] = node
            i = j
        for i in range(n_iv):
            _place(m, &m.by_lo[i].res, m.by_lo[i].sub, res)
            _place(m, &m.by_hi[i].res, m.by_hi[i].sub, res)
    finally:
        PyMem_Free(iv_tmp)
        PyMem_Free(pts)
    return 0


cdef void _place(Matcher m, Res* r, int sub, Residuals* res) noexcept:
    """Copy the residual program of ``sub`` to the ends of ``fast`` and ``slow``."""
    cdef int i
    cdef const Pred* q
    cdef Rng* f
    r.fast = res.n_fast
    r.slow = res.n_slow
    for i in range(res.beg[sub], res.beg[sub] + res.length[sub]):
        q = &res.preds[i]
        if q.op == NUM_RANGE or q.op == STR_EQ:
            f = &m.fast[res.n_fast]
            f.slot = 2 * q.attr + (q.op == STR_EQ)
            f.lo = q.lo if q.op == NUM_RANGE else q.sid
            f.hi = q.hi if q.op == NUM_RANGE else q.sid
            res.n_fast += 1
        else:
            m.slow[res.n_slow] = q[0]
            res.n_slow += 1
    r.nfast = res.n_fast - r.fast
    r.nslow = res.n_slow - r.slow


cdef double _estimate(Matcher m, const Pred* q, const int* num_off, const double* num_vals,
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


cdef int _node(Matcher m, const Ival* mid, int n, double center, int left, int right,
               int* n_nodes, int* n_bounds) noexcept:
    """Add a node holding the intervals ``mid`` (all contain ``center``)."""
    cdef int i, node = n_nodes[0], beg = n_bounds[0]
    for i in range(n):
        m.by_lo[beg + i].v = mid[i].lo
        m.by_lo[beg + i].sub = mid[i].sub
        m.by_hi[beg + i].v = mid[i].hi
        m.by_hi[beg + i].sub = mid[i].sub
    qsort(m.by_lo + beg, n, sizeof(Bound), _cmp_by_lo)
    qsort(m.by_hi + beg, n, sizeof(Bound), _cmp_by_hi)
    n_bounds[0] += n
    n_nodes[0] += 1
    m.nodes[node].center = center
    m.nodes[node].beg = beg
    m.nodes[node].end = beg + n
    m.nodes[node].left = left
    m.nodes[node].right = right
    return node


cdef int _tree(Matcher m, Ival* items, int n, Ival* tmp, double* pts,
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
    node = _node(m, items, nm, center, -1, -1, n_nodes, n_bounds)
    for i in range(nl):
        items[i] = tmp[i]
    for i in range(nr):
        items[nl + i] = tmp[n - 1 - i]
    left = _tree(m, items, nl, tmp, pts, n_nodes, n_bounds)
    right = _tree(m, items + nl, nr, tmp, pts, n_nodes, n_bounds)
    m.nodes[node].left = left
    m.nodes[node].right = right
    return node
