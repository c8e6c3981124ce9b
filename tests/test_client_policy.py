"""The client policy's seam (DESIGN §11): a replay's answer joins the live deliveries
held while it came, each publication once, in publisher order."""

from __future__ import annotations

from octopis.client_policy import join_at_seam


def test_the_seam_delivers_each_publication_once_in_publisher_order() -> None:
    delivered = {("p", 1, 1)}  # before the fail-over
    live = [("q", 2, 1), ("p", 1, 3)]  # held while the answer came

    def first_time(item: tuple[str, int, int]) -> bool:
        if item in delivered:
            return False
        delivered.add(item)
        return True

    replayed = [("p", 1, 2), ("p", 1, 1), ("q", 1, 7), ("p", 1, 2), ("p", 1, 3)]
    delivered.update(live)  # the live ones went through the connection's record
    joined, repeats = join_at_seam(live, replayed, lambda item: item, first_time)
    assert joined == [("p", 1, 2), ("p", 1, 3), ("q", 1, 7), ("q", 2, 1)]
    assert repeats == 3  # p#1 seen before, p#2 twice in the answer, p#3 held live
    assert len(joined) == len(set(joined))


def test_a_seam_with_nothing_replayed_keeps_the_live_deliveries_in_order() -> None:
    joined, repeats = join_at_seam([("b", 0, 2), ("a", 0, 9)], [], lambda i: i, lambda _: True)
    assert (joined, repeats) == ([("a", 0, 9), ("b", 0, 2)], 0)
