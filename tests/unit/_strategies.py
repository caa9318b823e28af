"""Hypothesis strategies shared by the unit tests: lbs-input documents."""

from __future__ import annotations

from hypothesis import strategies as st

#: Any JSON value json.loads returns (floats included, NaN and infinities not).
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
#: An assignment's Info.
infos = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
#: A data stream name.
names = st.text(min_size=1, max_size=30)
