# Interning (included by _match.pyx): attribute names and string constants get dense ids,
# reference counted by the subscriptions that use them; an attribute's id is recycled at
# once when its last subscription leaves, a string's only at the next build (the bitmaps
# may name it), and a new attribute id grows the loaded publication's arrays.


cdef int _intern_attr(Matcher m, str name) except -1:
    cdef int aid, old, i
    found = m._attr_ids.get(name)
    if found is not None:
        aid = found
        m._attr_refs[aid] += 1
        return aid
    if m._free_attrs:
        aid = m._free_attrs.pop()
        m._attr_refs[aid] = 1
    else:
        aid = len(m._attr_refs)
        m._attr_refs.append(1)
    m._attr_ids[name] = aid
    if aid >= m.acap:
        old = m.acap
        m.acap = max(16, 2 * m.acap)
        m.val = <double*>_alloc(m.val, 2 * m.acap * sizeof(double))
        for i in range(2 * old, 2 * m.acap):
            m.val[i] = NAN
        m.v_epoch = <uint32_t*>_alloc(m.v_epoch, m.acap * sizeof(uint32_t))
        memset(m.v_epoch + old, 0, (m.acap - old) * sizeof(uint32_t))
        m.v_kind = <char*>_alloc(m.v_kind, m.acap * sizeof(char))
        memset(m.v_kind + old, 0, m.acap - old)
        m.v_sid = <int*>_alloc(m.v_sid, m.acap * sizeof(int))
        memset(m.v_sid + old, 0, (m.acap - old) * sizeof(int))
        m.v_str = <const char**>_alloc(<void*>m.v_str, m.acap * sizeof(char*))
        m.v_len = <Py_ssize_t*>_alloc(m.v_len, m.acap * sizeof(Py_ssize_t))
        m.v_obj = <PyObject**>_alloc(m.v_obj, m.acap * sizeof(PyObject*))
        m.touched = <int*>_alloc(m.touched, m.acap * sizeof(int))
    return aid

cdef int _intern_str(Matcher m, str value) except -1:
    cdef int sid
    found = m._str_ids.get(value)
    if found is not None:
        sid = found
        m._str_refs[sid] += 1
        return sid
    encoded = value.encode("utf-8", "surrogatepass")
    if m._free_strs:
        sid = m._free_strs.pop()
        m._str_refs[sid] = 1
        m._str_text[sid] = value
        m._str_bytes[sid] = encoded
    else:
        sid = len(m._str_refs)
        m._str_refs.append(1)
        m._str_text.append(value)
        m._str_bytes.append(encoded)
    m._str_ids[value] = sid
    return sid

cdef int _release(Matcher m, object subscription) except -1:
    cdef int aid, sid
    for p in subscription.predicates:
        aid = m._attr_ids[p.attr]
        m._attr_refs[aid] -= 1
        if m._attr_refs[aid] == 0:
            del m._attr_ids[p.attr]
            m._free_attrs.append(aid)
        if isinstance(p.value, str):
            sid = m._str_ids[p.value]
            m._str_refs[sid] -= 1
            if m._str_refs[sid] == 0:
                del m._str_ids[p.value]
                m._str_text[sid] = None
                m._str_bytes[sid] = None
                m._retired_strs.append(sid)
    return 0
