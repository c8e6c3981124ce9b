# cython: language_level=3
"""Records the routing core makes for every notification, built in C (issue 16).

A ``NamedTuple``'s generated ``__new__`` is a Python call, and ``tuple.__new__(cls, it)``
builds a plain tuple first and copies it; routing makes one action per copy it sends, so
:func:`new_pair` allocates the record once and fills it. Nothing here knows a routing rule.
"""

from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_SET_ITEM

cdef extern from "Python.h":
    object PyType_GenericAlloc(object, Py_ssize_t)
    bint PyType_IsSubtype(object, object)


def new_pair(type cls, first, second):
    """``cls((first, second))`` for a two-field subclass of tuple (a ``NamedTuple``) in
    one allocation; TypeError if ``cls`` is not a subclass of tuple."""
    if not PyType_IsSubtype(cls, tuple):
        raise TypeError(f"{cls.__name__} is not a tuple type")
    cdef object record = PyType_GenericAlloc(cls, 2)
    Py_INCREF(first)
    PyTuple_SET_ITEM(record, 0, first)
    Py_INCREF(second)
    PyTuple_SET_ITEM(record, 1, second)
    return record
