"""A resumed checkpoint's loop position is checked for type and range before anything runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from conftest import assert_names
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_tfm.errors import CheckpointError
from vision_tfm.train.resume import MAX_COUNT, LoopState, check_state

PROP = settings(max_examples=60, deadline=None, derandomize=True, database=None)
PATH = Path("runs/x/last.pt")
COUNTS = ["epoch", "step_in_epoch", "num_updates", "loss_count", "seen"]


def _ck(**state) -> dict:
    return {"state": {**dataclasses.asdict(LoopState(epoch=1, num_updates=10)), **state}}


def test_what_the_engine_writes_passes() -> None:
    check_state(_ck(), PATH)
    check_state(_ck(best=0.5, time_s=3.0, world_size=2), PATH)


@PROP
@given(
    st.sampled_from(COUNTS),
    st.one_of(
        st.integers(max_value=-1),
        st.integers(min_value=MAX_COUNT + 1),
        st.floats(allow_nan=True),
        st.booleans(),
        st.text(max_size=3),
        st.none(),
        st.lists(st.integers(), max_size=2),
    ),
)
def test_counts_out_of_type_or_range_are_one_line_errors(key: str, value) -> None:
    """epoch=-5 and num_updates=10**18 trained on silently, logging epochs -4 to 2."""
    with pytest.raises(CheckpointError) as info:
        check_state(_ck(**{key: value}), PATH)
    assert_names(str(info.value), PATH, f"state.{key}")


@PROP
@given(st.sampled_from(COUNTS), st.integers(0, MAX_COUNT))
def test_counts_in_range_pass(key: str, value: int) -> None:
    check_state(_ck(**{key: value}), PATH)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("loss_sum", math.nan),
        ("loss_sum", math.inf),
        ("time_s", "1"),
        ("best", math.nan),
        ("best", math.inf),
        ("world_size", 0),
        ("world_size", 1.0),
    ],
)
def test_bad_sums_and_world_size(key: str, value) -> None:
    with pytest.raises(CheckpointError) as info:
        check_state(_ck(**{key: value}), PATH)
    assert_names(str(info.value), PATH, f"state.{key}")


def test_best_may_be_minus_inf_and_long_values_are_cut() -> None:
    check_state(_ck(best=-math.inf), PATH)
    with pytest.raises(CheckpointError) as info:
        check_state(_ck(epoch="x" * 10**6), PATH)
    assert len(str(info.value)) < 400


@pytest.mark.parametrize("ck", [{"state": [1, 2]}, {**_ck(), "history": {"a": 1}}])
def test_state_and_history_must_be_the_right_containers(ck) -> None:
    with pytest.raises(CheckpointError) as info:
        check_state(ck, PATH)
    assert_names(str(info.value), PATH)
