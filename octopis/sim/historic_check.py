"""The nemesis's check of historic queries (:mod:`octopis.sim.nemesis`): each against the
reference of what was published in its window, from the whole history."""

from __future__ import annotations

from typing import Any

from octopis.core import Notification
from octopis.sim.engine import Simulator
from octopis.sim.stores import in_gaps

Window = tuple[int, float, float]
"""A historic query's ``(k, after, until)``, in the simulator's time."""


def check_historic(
    sim: Simulator, asked: dict[str, Window], notes: dict[tuple[str, int], Notification]
) -> dict[str, Any]:
    """Each historic query against the reference: every publication routed (``notes``)
    published in its window whose ``x`` is below its ``k``, once; nothing else (a
    publication outside the window or the filter is a problem); one missing is accounted
    for only by a gap reported to the asker (a store silent, or a store's range it no
    longer holds), or by a round its host never finished (it died under it); one its
    store refused (a full disk) is counted refused."""
    problems: list[str] = []
    counts = dict.fromkeys(("expected", "delivered", "duplicated", "lost", "silent", "refused"), 0)
    for req_id, (k, after, until) in sorted(asked.items()):
        got = sim.historic_received[req_id]
        reference = {
            key
            for key, n in notes.items()
            if after <= n.published_at < until and n.publication["x"] < k
        }
        extra = sorted(set(got) - reference)
        if extra:
            problems.append(f"historic {req_id}: {len(extra)} outside its window or filter: "
                            f"{extra[:3]}")  # fmt: skip
        refused = {key for key in reference - set(got) if key in sim.retention.refused}
        missing = reference - set(got) - refused
        asker = sim._requesters[req_id]
        if sim.replay_gaps.get(asker) or req_id not in sim.historic_done:
            silent = set()
        else:
            told = sim.store_gaps.get(asker, set())
            silent = {key for key in missing if not in_gaps(told, notes[key])}
        if silent:
            problems.append(f"historic {req_id}: {len(silent)} missing, no gap reported: "
                            f"{sorted(silent)[:3]}")  # fmt: skip
        counts["expected"] += len(reference)
        counts["delivered"] += len(set(got) & reference)
        counts["duplicated"] += len(got) - len(set(got))
        counts["lost"] += len(missing)
        counts["silent"] += len(silent)
        counts["refused"] += len(refused)
        if len(got) != len(set(got)):
            problems.append(f"historic {req_id}: {len(got) - len(set(got))} duplicated")
    return {"problems": problems, **counts}
