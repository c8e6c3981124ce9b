"""The simulator's shared matcher: every part answers as its own reference matcher would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from laws import sized

from octopis.filters.language import Predicate, Subscription
from octopis.matching import ReferenceMatcher, SharedMatcher

predicates = st.one_of(
    st.builds(Predicate, st.sampled_from("xy"), st.sampled_from(["<", ">=", "="]),
              st.integers(0, 4)),
    st.builds(Predicate, st.just("s"), st.sampled_from(["eq", "str-prefix"]),
              st.sampled_from(["a", "ab", "b"])),
)  # fmt: skip
subscriptions = st.lists(predicates, min_size=1, max_size=2).map(lambda ps: Subscription(tuple(ps)))
publications = st.fixed_dictionaries(
    {"x": st.integers(0, 4), "y": st.integers(0, 4), "s": st.sampled_from(["a", "ab", "b"])}
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 2), st.integers(0, 9), st.integers(0, 3)),
        st.tuples(st.just("remove"), st.integers(0, 2), st.integers(0, 9)),
        st.tuples(st.just("match"), publications),
    ),
    max_size=60,
)


@settings(max_examples=sized(40, 150), deadline=None)
@given(st.lists(subscriptions, min_size=10, max_size=10), steps)
def test_parts_agree_with_a_reference_matcher_each(subs: list, steps: list) -> None:
    """Three parts hold overlapping keys (a key always with the same subscription, as a
    sub_id in a simulation); after any adds and removes, each part's ``match_groups``
    finds exactly the groups its reference finds, each with a matching key of the group."""
    shared = SharedMatcher(cache=2)
    parts = [shared.part() for _ in range(3)]
    references = [ReferenceMatcher() for _ in range(3)]
    groups: list[dict[str, int]] = [{}, {}, {}]
    for step in steps:
        if step[0] == "add":
            _, p, i, group = step
            key = f"k{i}"
            if key in groups[p]:
                with pytest.raises(KeyError):
                    parts[p].add(key, subs[i], group)
                continue
            parts[p].add(key, subs[i], group)
            references[p].add(key, subs[i], group)
            groups[p][key] = group
        elif step[0] == "remove":
            _, p, i = step
            key = f"k{i}"
            if key not in groups[p]:
                with pytest.raises(KeyError):
                    parts[p].remove(key)
                continue
            parts[p].remove(key)
            references[p].remove(key)
            del groups[p][key]
        else:
            publication = step[1]
            for part, reference, held in zip(parts, references, groups, strict=True):
                found = part.match_groups(publication)
                assert set(found) == set(reference.match_groups(publication))
                for group, key in found.items():
                    assert held[key] == group and subs[int(key[1:])].matches(publication)
                assert sorted(part.match(publication)) == sorted(reference.match(publication))
        assert len(shared) == len(set().union(*groups))
        assert [len(part) for part in parts] == [len(held) for held in groups]


def test_a_key_keeps_its_subscription() -> None:
    shared = SharedMatcher()
    a, b = shared.part(), shared.part()
    first = Subscription((Predicate("x", "<", 1),))
    a.add("k", first, 0)
    b.add("k", Subscription((Predicate("x", "<", 1),)), 1)  # equal: the same subscription
    with pytest.raises(ValueError, match="another subscription"):
        shared.part().add("k", Subscription((Predicate("x", "<", 2),)), 0)
    assert len(shared) == 1
    a.remove("k")
    assert b.match_groups({"x": 0}) == {1: "k"}
    b.remove("k")
    assert len(shared) == 0 and b.match_groups({"x": 0}) == {}


def test_cached_matches_follow_changes() -> None:
    """A publication matched before a subscription arrives is matched again after."""
    shared = SharedMatcher(cache=1)
    part = shared.part()
    publication = {"x": 0}
    assert part.match_groups(publication) == {}
    part.add("k", Subscription((Predicate("x", "<", 1),)), 3)
    assert part.match_groups(publication) == {3: "k"}
    part.match_groups({"x": 5})  # pushes the first publication out of the cache
    part.remove("k")
    assert part.match_groups(publication) == {}
    with pytest.raises(ValueError):
        SharedMatcher(cache=0)
