"""Fuzz the STOMP frame decoder (octopis.gateway.frames): valid frames, mutated frames and
random bytes, fed in random pieces to fresh and long-lived decoders. A crash is any
exception other than FrameError; memory is measured with tracemalloc after a warm-up, so
growth means something is kept from frame to frame.

    .venv/bin/python -m bench.stomp_fuzz --frames 100000
"""

from __future__ import annotations

import argparse
import random
import tracemalloc
from dataclasses import dataclass

from octopis.gateway.frames import (
    CLIENT_COMMANDS,
    Decoder,
    Frame,
    FrameError,
    FrameLimits,
    encode,
)

LIMITS = FrameLimits(header_bytes=1024, headers=16, body_bytes=4096)
_NAMES = ["destination", "selector", "ack", "id", "receipt", "content-length", "x", "k:y"]
_VALUES = ["/topic/STOCK", "close > 1", "client", "0", "7", "3", "a\\nb", "\\q", "", "é"]


@dataclass
class FuzzReport:
    """What a fuzz run saw."""

    frames: int = 0
    decoded: int = 0
    refused: int = 0
    crashes: int = 0
    growth_bytes: int = 0
    first_crash: str = ""


def _valid(rng: random.Random) -> bytes:
    headers = {rng.choice(_NAMES): rng.choice(_VALUES) for _ in range(rng.randrange(6))}
    headers.pop("content-length", None)
    body = rng.randbytes(rng.randrange(64))
    return encode(Frame(rng.choice(sorted(CLIENT_COMMANDS)), headers, body))


def _mutate(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        how = rng.randrange(5)
        i = rng.randrange(len(out) + 1)
        if how == 0 and out:
            del out[min(i, len(out) - 1)]
        elif how == 1:
            out[i:i] = bytes([rng.choice(b"\0\n\r:\\x\xff")])
        elif how == 2 and out:
            out[min(i, len(out) - 1)] = rng.randrange(256)
        elif how == 3:
            out[i:i] = rng.choice([b"content-length:9999999\n", b"\n\n", b"x" * 2000, b"\\"])
        else:
            out[i:i] = rng.randbytes(rng.randrange(1, 40))
    return bytes(out)


def _one(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.4:
        return _valid(rng)
    if kind < 0.9:
        return _mutate(rng, _valid(rng))
    return rng.randbytes(rng.randrange(1, 200))


def _feed(decoder: Decoder, data: bytes, rng: random.Random, report: FuzzReport) -> None:
    """Feed ``data`` in random pieces, taking out each frame as it completes."""
    i = 0
    while i < len(data):
        step = rng.randrange(1, 64)
        decoder.feed(data[i : i + step])
        i += step
        while decoder.next_frame() is not None:
            report.decoded += 1


def fuzz(frames: int, seed: int = 0) -> FuzzReport:
    """Run ``frames`` inputs; measure memory after the first tenth."""
    rng = random.Random(seed)
    report = FuzzReport()
    decoder = Decoder(LIMITS)
    warm = max(1, frames // 10)
    tracemalloc.start()
    baseline = 0
    try:
        for n in range(frames):
            if n == warm:
                baseline = tracemalloc.get_traced_memory()[0]
            report.frames += 1
            try:
                _feed(decoder, _one(rng), rng, report)
            except FrameError:
                report.refused += 1
                decoder = Decoder(LIMITS)  # the connection is closed after an ERROR
            except Exception as e:
                report.crashes += 1
                report.first_crash = report.first_crash or repr(e)
                decoder = Decoder(LIMITS)
        decoder = Decoder(LIMITS)
        report.growth_bytes = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--frames", type=int, default=100_000, help="inputs fed to the decoders (default 100,000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    args = parser.parse_args()
    r = fuzz(args.frames, args.seed)
    print(
        f"frames {r.frames}, decoded {r.decoded}, refused {r.refused}, crashes {r.crashes}, "
        f"memory growth after warm-up {r.growth_bytes} bytes {r.first_crash}"
    )


if __name__ == "__main__":
    main()
