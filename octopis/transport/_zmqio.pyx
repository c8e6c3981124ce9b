# cython: language_level=3, boundscheck=False, wraparound=False
"""ZeroMQ receives and sends of the forwarding path in C (DESIGN §5, issue 16).

pyzmq spends ~1 µs of Python per message part (a ``Frame`` or ``bytes`` object, flag
enums, the ``more`` check); a broker hop pays it for every part it reads and writes. These
functions call the very libzmq that pyzmq loaded, through function pointers that
:mod:`octopis.transport.zmqio` looks up and hands to :func:`bind`, so the extension links
against nothing and works with pyzmq's bundled or the system's libzmq. The caller passes a
socket's ``underlying`` handle and must not pass one that is closed.

No routing happens here: these move bytes between ZeroMQ and Python lists, and number a
link's frames and keep its notifications in custody as they leave (DESIGN §7), the
per-frame bookkeeping of :class:`octopis.transport.links.OutputLink`.
"""

from libc.stdint cimport uintptr_t
from libc.string cimport memcmp
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE

from zmq import ZMQError

cdef extern from *:
    """
    /* zmq.h's message: 64 opaque bytes, pointer-aligned. */
    typedef struct { unsigned char _[64] __attribute__((aligned(sizeof(void *)))); } octopis_zmq_msg_t;
    """
    ctypedef struct zmq_msg_t "octopis_zmq_msg_t":
        pass

ctypedef int (*msg_init_f)(zmq_msg_t*) noexcept nogil
ctypedef int (*msg_recv_f)(zmq_msg_t*, void*, int) noexcept nogil
ctypedef void* (*msg_data_f)(zmq_msg_t*) noexcept nogil
ctypedef size_t (*msg_size_f)(const zmq_msg_t*) noexcept nogil
ctypedef int (*msg_more_f)(const zmq_msg_t*) noexcept nogil
ctypedef int (*msg_close_f)(zmq_msg_t*) noexcept nogil
ctypedef int (*send_f)(void*, const void*, size_t, int) noexcept nogil
ctypedef int (*errno_f)() noexcept nogil
ctypedef int (*getsockopt_f)(void*, int, void*, size_t*) noexcept nogil

cdef msg_init_f z_msg_init = NULL
cdef msg_recv_f z_msg_recv = NULL
cdef msg_data_f z_msg_data = NULL
cdef msg_size_f z_msg_size = NULL
cdef msg_more_f z_msg_more = NULL
cdef msg_close_f z_msg_close = NULL
cdef send_f z_send = NULL
cdef errno_f z_errno = NULL
cdef getsockopt_f z_getsockopt = NULL

cdef enum:
    DONTWAIT = 1
    SNDMORE = 2
    EINTR = 4
    EAGAIN = 11
    ZMQ_EVENTS = 15

FUNCTIONS = (
    "zmq_msg_init",
    "zmq_msg_recv",
    "zmq_msg_data",
    "zmq_msg_size",
    "zmq_msg_more",
    "zmq_msg_close",
    "zmq_send",
    "zmq_errno",
    "zmq_getsockopt",
)
"""The libzmq functions :func:`bind` needs, by name."""


def bind(dict addresses) -> None:
    """Use the libzmq functions at ``addresses`` (name → address, every name of
    :data:`FUNCTIONS`)."""
    global z_msg_init, z_msg_recv, z_msg_data, z_msg_size, z_msg_more, z_msg_close
    global z_send, z_errno, z_getsockopt
    missing = [name for name in FUNCTIONS if not addresses.get(name)]
    if missing:
        raise ValueError(f"libzmq functions missing: {', '.join(missing)}")
    z_msg_init = <msg_init_f><uintptr_t>addresses["zmq_msg_init"]
    z_msg_recv = <msg_recv_f><uintptr_t>addresses["zmq_msg_recv"]
    z_msg_data = <msg_data_f><uintptr_t>addresses["zmq_msg_data"]
    z_msg_size = <msg_size_f><uintptr_t>addresses["zmq_msg_size"]
    z_msg_more = <msg_more_f><uintptr_t>addresses["zmq_msg_more"]
    z_msg_close = <msg_close_f><uintptr_t>addresses["zmq_msg_close"]
    z_send = <send_f><uintptr_t>addresses["zmq_send"]
    z_errno = <errno_f><uintptr_t>addresses["zmq_errno"]
    z_getsockopt = <getsockopt_f><uintptr_t>addresses["zmq_getsockopt"]


cdef inline object _part(void* sock, zmq_msg_t* msg, int flags, int* more, bytes same=None):
    """The next part as bytes (``more`` set to whether another follows); ``same`` itself
    when the part holds the same bytes (a sender's name repeats message after message:
    one object, whose hash is computed once); None if ``flags`` has DONTWAIT and nothing
    is waiting; ZMQError on any other failure."""
    cdef int err
    cdef size_t size
    while True:
        z_msg_init(msg)
        if z_msg_recv(msg, sock, flags) >= 0:
            break
        err = z_errno()
        z_msg_close(msg)
        if err == EAGAIN:
            return None
        if err != EINTR:
            raise ZMQError(err)
    size = z_msg_size(msg)
    if (
        same is not None
        and <size_t>PyBytes_GET_SIZE(same) == size
        and memcmp(PyBytes_AS_STRING(same), z_msg_data(msg), size) == 0
    ):
        part = same
    else:
        part = PyBytes_FromStringAndSize(<char*>z_msg_data(msg), size)
    more[0] = z_msg_more(msg)
    z_msg_close(msg)
    return part


def receive(uintptr_t handle, Py_ssize_t limit, bint runs=False) -> list:
    """The messages waiting on socket ``handle``, each a list of its parts (bytes), until
    none is waiting or the parts after the first of each message number ``limit`` (a
    frame count: ``[sender, body, body]`` counts 2). Never blocks; ``[]`` when nothing is
    waiting. A multipart message arrives whole, so its later parts never wait.

    With ``runs``, a message of two or more parts whose first part equals the previous
    message's has its later parts appended to that message instead: a run of messages
    from one sender comes back as one ``[sender, body, body, ...]``, in order."""
    if z_msg_recv == NULL:
        raise RuntimeError("octopis.transport._zmqio is not bound to libzmq")
    cdef void* sock = <void*>handle
    cdef zmq_msg_t msg
    cdef int more = 0
    cdef Py_ssize_t frames = 0
    cdef list messages = []
    cdef list parts
    cdef list run = None
    cdef bytes first = None
    while frames < limit:
        first = _part(sock, &msg, DONTWAIT, &more, first)
        if first is None:
            break
        if run is not None and more and first is run[0]:
            parts = run
        else:
            parts = [first]
            messages.append(parts)
            run = parts if runs and more else None
        if not more:
            frames += 1
        while more:
            parts.append(_part(sock, &msg, 0, &more))
            frames += 1
    return messages


cdef inline int _send(void* sock, object part, int flags) except -2:
    """Send one part; 0 sent, -1 the pipe is full (only with DONTWAIT)."""
    cdef int err
    while z_send(sock, PyBytes_AS_STRING(part), PyBytes_GET_SIZE(part), flags) < 0:
        err = z_errno()
        if err == EAGAIN:
            return -1
        if err != EINTR:
            raise ZMQError(err)
    return 0


cdef enum:
    KIND_HANDSHAKE = 1
    KIND_DATA = 2
    KIND_KEPT = 3

LINK, HANDSHAKE, DATA, KEPT = 0, KIND_HANDSHAKE, KIND_DATA, KIND_KEPT
"""What a queued frame ``[sender, body, kind, ...]`` is (``kind``, never sent): a
link-level frame (heartbeat), the handshake that starts a numbered session, a routing
frame, or a routing frame kept in custody until acknowledged (a notification, DESIGN §7)."""


def send_batch(
    uintptr_t handle, queue, Py_ssize_t most, Py_ssize_t max_bytes, Py_ssize_t room
) -> int:
    """Send the frames at the head of ``queue`` (``[sender, body, kind, ...]`` lists) that
    may leave now as one message ``[sender of the first, body, body, ...]`` on socket
    ``handle``, without blocking: link-level frames (kind below :data:`DATA`) always,
    routing frames while ``room`` lasts; at most ``most`` frames, none after the one that
    brings the bodies to ``max_bytes``. Returns how many were sent: 0 when none may
    leave, -1 (nothing sent) when the pipe is full. Every frame taken is checked before
    the first part leaves: once it is in, ZeroMQ takes the whole message."""
    if z_send == NULL:
        raise RuntimeError("octopis.transport._zmqio is not bound to libzmq")
    cdef void* sock = <void*>handle
    cdef list bodies = []
    cdef list frame
    cdef bytes body
    cdef bytes head = None
    cdef Py_ssize_t i, count = 0, size = 0
    for item in queue:
        frame = <list?>item
        if len(frame) < 3:
            raise ValueError(f"a queued frame has {len(frame)} items, expected [sender, body, kind]")
        if <long>frame[2] >= KIND_DATA:
            if room <= 0:
                break
            room -= 1
        if head is None:
            head = <bytes?>frame[0]
        body = <bytes?>frame[1]
        bodies.append(body)
        count += 1
        size += PyBytes_GET_SIZE(body)
        if count == most or size >= max_bytes:
            break
    if count == 0:
        return 0
    if _send(sock, head, SNDMORE | DONTWAIT) < 0:
        return -1
    for i in range(count):
        _send(sock, bodies[i], 0 if i == count - 1 else SNDMORE)
    return count


def book_sent(queue, Py_ssize_t count, list custody, list pending, Py_ssize_t numbered, now) -> tuple:
    """Take the ``count`` frames just sent off the head of ``queue``: routing frames are
    numbered on from ``numbered`` (a handshake starts the count again at 0); each
    notification (:data:`KEPT`) goes into ``custody`` as ``(number, now, frame)`` and each
    other routing frame into ``pending`` as ``(number, frame)`` (both None: custody is
    off). Returns ``(numbered, size, kept, receipts, greeted)``: the last number given,
    the bytes of the bodies, the notifications taken, how many of those that went into
    custody carry a fourth item (a publication's receipt) and whether a handshake went
    (the caller's :meth:`~octopis.core.custody.Custody.greeted`)."""
    popleft = queue.popleft
    cdef list frame
    cdef long kind
    cdef Py_ssize_t i, size = 0, kept = 0, receipts = 0
    cdef bint greeted = False
    for i in range(count):
        frame = <list?>popleft()
        size += PyBytes_GET_SIZE(<bytes?>frame[1])
        kind = frame[2]
        if kind >= KIND_DATA:
            numbered += 1
            if kind == KIND_KEPT:
                kept += 1
                if custody is not None:
                    custody.append((numbered, now, frame))
                    receipts += len(frame) > 3
            elif pending is not None:
                pending.append((numbered, frame))
        elif kind == KIND_HANDSHAKE:
            numbered = 0
            greeted = True
    return numbered, size, kept, receipts, greeted


def send_parts(uintptr_t handle, list parts) -> bool:
    """Send ``parts`` (bytes, at least one) as one message on socket ``handle`` without
    blocking; False (nothing sent) when the pipe is full."""
    if z_send == NULL:
        raise RuntimeError("octopis.transport._zmqio is not bound to libzmq")
    cdef void* sock = <void*>handle
    cdef Py_ssize_t i, last = len(parts) - 1
    if last < 0:
        raise ValueError("send_parts needs at least one part")
    for part in parts:
        if type(part) is not bytes:
            raise TypeError(f"send_parts sends bytes, got {type(part).__name__}")
    if _send(sock, parts[0], DONTWAIT if last == 0 else SNDMORE | DONTWAIT) < 0:
        return False
    for i in range(1, last + 1):
        _send(sock, parts[i], 0 if i == last else SNDMORE)
    return True


def events(uintptr_t handle) -> int:
    """Socket ``handle``'s ``ZMQ_EVENTS`` (POLLIN 1, POLLOUT 2) as a plain int; reading it
    also resets ZeroMQ's edge-triggered FD signal, as pyzmq's ``getsockopt`` does, without
    its flag enum (~2 µs a call)."""
    if z_getsockopt == NULL:
        raise RuntimeError("octopis.transport._zmqio is not bound to libzmq")
    cdef int value = 0, err
    cdef size_t size = sizeof(int)
    while z_getsockopt(<void*>handle, ZMQ_EVENTS, &value, &size) < 0:
        err = z_errno()
        if err != EINTR:  # a signal (the broker's SIGTERM) interrupted it: ask again
            raise ZMQError(err)
        size = sizeof(int)
    return value
