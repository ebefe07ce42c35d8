"""Shared Hypothesis strategies for the engine tests.

Everything here generates *raw* arguments as a client would pass them to ``Engine`` methods
(send entries, durations, receipts-to-forge, queue attributes). Strategies never decide what the
engine should answer: the tests' reference model does that from DESIGN.md §2.

Scope: the core machine (``test_model.py``: one or two queues, the ``default`` tag, no topics)
and, at the end, the readers machine (``test_model_readers.py``: tags and their filters, topics,
dead-letter queues, rewind).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# -- bodies and attributes ---------------------------------------------------------------------

#: Non-empty bodies: bytes, or text (counted as UTF-8, so 1 character is at least 1 byte).
#: Surrogates are excluded by ``st.text`` already (they cannot be UTF-8 encoded).
bodies = st.one_of(
    st.binary(min_size=1, max_size=16),
    st.text(min_size=1, max_size=8),
)

attribute_names = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x2FF),
    min_size=1, max_size=8,
).filter(lambda name: not name.startswith("DLQ."))

#: Attribute values DESIGN.md §2 allows: text / bytes / int / float / bool.
attribute_values = st.one_of(
    st.text(max_size=6),
    st.binary(max_size=6),
    st.integers(min_value=-(1 << 64), max_value=(1 << 64) - 1),
    st.sampled_from([-(1 << 64), (1 << 64) - 1, 0, -1]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)

attributes = st.dictionaries(attribute_names, attribute_values, max_size=3)

# -- durations ---------------------------------------------------------------------------------

#: Per-message delays in seconds (0-3 s as int or float; a few that floor to 0 ms, or that sit
#: next to a whole millisecond).
message_delays = st.one_of(
    st.integers(min_value=0, max_value=3),
    st.floats(min_value=0, max_value=3, allow_nan=False),
    st.sampled_from([0, 0.0, 0.0004, 0.001, 0.0015, 1, 1.0, 1.9999, 2.5, 3]),
)

#: ``visibility_timeout`` of a receive (1-5 s).
receive_visibilities = st.one_of(
    st.integers(min_value=1, max_value=5),
    st.floats(min_value=1, max_value=5, allow_nan=False),
    st.sampled_from([1, 1.0005, 2, 2.5, 5]),
)

#: ``change_visibility`` timeouts (0-5 s; 0 and values below 1 ms end the lease at once).
visibility_changes = st.one_of(
    st.integers(min_value=0, max_value=5),
    st.floats(min_value=0, max_value=5, allow_nan=False),
    st.sampled_from([0, 0.0, 0.0009, 0.001, 1, 3.0]),
)

#: Values that are not a valid duration argument for ``change_visibility`` (0-43200 s) or for a
#: receive's ``visibility_timeout`` (1-43200 s).
bad_durations = st.sampled_from([-1, -0.001, 43201, 43200.5, True, False, "1", None,
                                 float("nan"), float("inf")])

#: How far one step moves the fake clock, in ms. The sampled values hit lease and delay
#: deadlines exactly (they are whole seconds from the step that set them) and retention (61 s).
clock_steps = st.one_of(
    st.integers(min_value=0, max_value=6000),
    st.integers(min_value=0, max_value=6000),
    st.sampled_from([0, 1, 999, 1000, 1001, 2000, 3000, 5000, 30_000]),
    st.sampled_from([0, 1, 999, 1000, 1001, 2000, 3000, 5000, 30_000]),
    st.just(61_000),
)

# -- send entries ------------------------------------------------------------------------------


@st.composite
def valid_entries(draw: st.DrawFn) -> Any:
    """A valid send entry (PROTOCOL.md §4): a body alone, or a map with keys 1, 2, 4, 5."""
    body = draw(bodies)
    if draw(st.booleans()):
        return body
    entry: dict[int, Any] = {1: body}
    if draw(st.booleans()):
        entry[2] = draw(attributes)
    if draw(st.booleans()):
        entry[4] = draw(st.integers(min_value=1, max_value=16))
    if draw(st.integers(0, 2)) == 0:
        entry[5] = draw(message_delays)
    return entry


def _with(body: Any, **fields: Any) -> dict[Any, Any]:
    entry: dict[Any, Any] = {1: body}
    for key, value in fields.items():
        entry[int(key[1:])] = value
    return entry


#: Entries that break exactly one rule of DESIGN.md §2 / PROTOCOL.md §4 -> ``InvalidArgument``.
invalid_entries = st.one_of(
    st.sampled_from([
        b"", "", {1: b""}, {1: ""},                       # empty body
        {4: 3}, {2: {"a": 1}},                            # no body
        {1: 5}, {1: None}, {1: [b"x"]}, 42, None, [b"x"],  # not bytes / text / map
        {1: b"x", 4: 0}, {1: b"x", 4: 17}, {1: b"x", 4: -1},  # priority out of 1-16
        {1: b"x", 4: True}, {1: b"x", 4: False},          # booleans are never integers
        {1: b"x", 4: 3.0}, {1: b"x", 4: "3"},             # priority not an integer
        {1: b"x", 6: 1}, {1: b"x", 0: 1}, {1: b"x", "1": 1}, {1: b"x", "body": 1},  # keys
        {1: b"x", 5: -1}, {1: b"x", 5: -0.5}, {1: b"x", 5: True}, {1: b"x", 5: "1"},  # delay
        {1: b"x", 5: float("nan")}, {1: b"x", 5: float("inf")},
        {1: b"x", 5: 30 * 86400 + 1},                     # delay over 30 days
        {1: b"x", 2: {"DLQ.source": 1}},                  # reserved attribute prefix
        {1: b"x", 2: {"": 1}},                            # attribute name of 0 bytes
        {1: b"x", 2: {"n" * 129: 1}},                     # attribute name of 129 bytes
        {1: b"x", 2: {"a": None}}, {1: b"x", 2: {"a": [1]}}, {1: b"x", 2: {"a": {"b": 1}}},
        {1: b"x", 2: {"a": 1 << 64}}, {1: b"x", 2: {"a": -(1 << 64) - 1}},
        {1: b"x", 2: {"a": float("nan")}}, {1: b"x", 2: {"a": float("-inf")}},
        {1: b"x", 2: {1: "x"}}, {1: b"x", 2: [("a", 1)]}, {1: b"x", 2: "a=1"},
        {1: b"x", 2: {f"k{i}": i for i in range(65)}},     # 65 attributes
    ]),
    bodies.map(lambda body: _with(body, k4=0)),
    bodies.map(lambda body: _with(body, k4=17)),
)

#: Entries right at the 1024-byte ``max_message_size`` of a small queue (body bytes + CBOR
#: attributes): valid in a default queue, ``MessageTooLarge`` above 1024 in a small one.
sized_entries = st.one_of(
    st.integers(min_value=1020, max_value=1028).map(lambda n: b"s" * n),
    st.integers(min_value=509, max_value=514).map(lambda n: "\u00e9" * n),  # 2 bytes each
    st.integers(min_value=1018, max_value=1024).map(lambda n: {1: b"s" * n, 2: {"a": 1}}),
)

#: Send entries as a consumer would mix them: mostly valid, some invalid, a few large.
send_entries = st.one_of(
    valid_entries(), valid_entries(), valid_entries(), valid_entries(),
    invalid_entries, sized_entries,
)

send_batches = st.lists(send_entries, min_size=1, max_size=5)

# -- receipts ----------------------------------------------------------------------------------

#: Byte strings no engine issued (random lengths, including the real receipt length 41).
random_receipts = st.one_of(
    st.binary(max_size=48),
    st.binary(min_size=41, max_size=41),
)

# -- queues ------------------------------------------------------------------------------------


@st.composite
def queue_attributes(draw: st.DrawFn) -> dict[str, Any]:
    """Attributes for a queue of the model's scope: small ``max_messages`` for ``QueueFull``,
    the minimum ``retention`` (60 s) for expiry, a short default visibility, a default delay,
    a small ``max_message_size``."""
    attrs: dict[str, Any] = {}
    if draw(st.integers(0, 3)) == 0:
        attrs["max_messages"] = draw(st.sampled_from([1, 3, 5, 8]))
    if draw(st.booleans()):
        attrs["retention"] = 60
    if draw(st.integers(0, 3)) == 0:
        attrs["visibility_timeout"] = draw(st.sampled_from([1, 2]))
    if draw(st.integers(0, 3)) == 0:
        attrs["delay"] = 1
    if draw(st.integers(0, 3)) == 0:
        attrs["max_message_size"] = 1024
    return attrs


#: Keyword arguments for ``Engine.open``: sometimes tiny segments, so whole segments are
#: collected behind ``gone_seq`` while the machine runs.
engine_options = st.one_of(
    st.just({}),
    st.builds(dict, segment_max_messages=st.sampled_from([1, 2, 3, 7])),
    st.builds(dict, segment_max_age_ms=st.sampled_from([1, 1000, 5000])),
)


# -- readers: tags, topics, dead-letter queues, rewind, peek -----------------------------------
#
# The second machine (test_model_readers.py) needs send entries that tag filters can match and
# topics that collide: attributes come from a small vocabulary of names and of values that are
# equal across CBOR types (1, 1.0, True, "1", b"1"), topics from two names.

#: Topic names of the readers machine (topics are compared exactly; no case rule applies).
TOPICS = ("ta", "tb")

#: Attribute names a tag filter may name (``DLQ.sourceQueue`` only on a DLQ's copies).
FILTER_NAMES = ("k", "v")

#: Values that differ only in CBOR type, so "same type" is what decides a match.
FILTER_VALUES = (1, 1.0, True, "1", b"1", 2, False, 0)

reader_attribute_values = st.sampled_from(FILTER_VALUES)

reader_attributes = st.one_of(
    st.dictionaries(st.sampled_from(FILTER_NAMES), reader_attribute_values, max_size=2),
    st.dictionaries(st.sampled_from(FILTER_NAMES), reader_attribute_values, max_size=2).map(
        lambda attrs: {**attrs, "other": 7}),
)


@st.composite
def reader_valid_entries(draw: st.DrawFn) -> Any:
    """A valid send entry: a body alone, or a map with attributes the filters look at, a topic
    (never with a non-default priority), a priority or a delay."""
    body = draw(bodies)
    if draw(st.integers(0, 4)) == 0:
        return body
    entry: dict[int, Any] = {1: body}
    if draw(st.integers(0, 2)) > 0:
        entry[2] = draw(reader_attributes)
    if draw(st.booleans()):
        entry[3] = draw(st.sampled_from(TOPICS))
        if draw(st.integers(0, 5)) == 0:
            entry[4] = 8  # the default priority, given explicitly: allowed with a topic
    elif draw(st.integers(0, 2)) == 0:
        entry[4] = draw(st.sampled_from([1, 2, 8, 16]))
    if draw(st.integers(0, 4)) == 0:
        entry[5] = draw(st.sampled_from([0, 0.0004, 1, 1.5, 2]))
    return entry


#: Entries that break exactly one topic rule -> ``InvalidArgument``.
invalid_topic_entries = st.sampled_from([
    {1: b"x", 3: "ta", 4: 2}, {1: b"x", 3: "tb", 4: 16}, {1: b"x", 3: "ta", 4: 1},  # both
    {1: b"x", 3: ""}, {1: b"x", 3: "t" * 129}, {1: b"x", 3: 5}, {1: b"x", 3: ["ta"]},
])

reader_entries = st.one_of(
    reader_valid_entries(), reader_valid_entries(), reader_valid_entries(),
    reader_valid_entries(), reader_valid_entries(), reader_valid_entries(),
    invalid_topic_entries, invalid_entries,
)

reader_batches = st.lists(reader_entries, min_size=1, max_size=4)

#: Tag names of the readers machine: "RED" names the same tag as "red" (names ignore case).
TAG_NAMES = ("red", "Blue", "RED")


@st.composite
def tag_filters(draw: st.DrawFn, dlq: bool = False) -> dict[str, Any] | None:
    """None, or a filter on 1-2 attributes (``null`` = present), match all / any / omitted."""
    if draw(st.integers(0, 2)) == 0:
        return None
    names = FILTER_NAMES + (("DLQ.sourceQueue",) if dlq else ())
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
    attributes = {name: draw(st.none() | reader_attribute_values) for name in chosen}
    flt: dict[str, Any] = {"attributes": attributes}
    match = draw(st.sampled_from(["all", "any", None]))
    if match is not None:
        flt["match"] = match
    return flt


@st.composite
def reader_queue_attributes(draw: st.DrawFn) -> dict[str, Any]:
    """``queue_attributes`` plus a rewind window (0 = off) no longer than retention."""
    attrs = draw(queue_attributes())
    if draw(st.booleans()):
        attrs["visibility_timeout"] = draw(st.sampled_from([1, 2]))  # leases run out
    rewind = draw(st.sampled_from([0, 0, 30, 60]))
    if rewind:
        attrs["rewind"] = rewind
    return attrs


def draw_visibility_entry(data: st.DataObject, raw: object) -> Any:
    """A ``change_visibility`` entry for receipt ``raw``: mostly valid, sometimes a bad timeout
    or a malformed entry."""
    shape = data.draw(st.integers(0, 15), label="entry shape")
    if shape == 0:
        return [raw, data.draw(bad_durations, label="bad timeout")]
    if shape == 1:
        return data.draw(st.sampled_from([[raw], [raw, 1, 1], raw, None]))
    return [raw, data.draw(visibility_changes, label="timeout")]
