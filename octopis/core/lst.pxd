# Types of octopis/core/lst.py when compiled (issue 16): a row's counts are C fields and
# the table's per-copy events (enqueued, sent, down, overloaded) run without Python
# attribute lookups. The module stays plain Python; see setup.py.

cdef class LinkRow:
    cdef public double window_start
    cdef public long long n_in
    cdef public long long n_out
    cdef public double ce
    cdef public long long queue_length
    cdef public long long last_n_in
    cdef public long long last_n_out
    cdef public double last_event


cdef class LinkStatusTable:
    cdef public double window
    cdef public long long queue_threshold
    cdef public str order
    cdef public double now
    cdef public dict rows
    cdef set _down
    cdef public long long notifications_in
    cdef public long long notifications_ahead
    cdef public long long most_ahead
