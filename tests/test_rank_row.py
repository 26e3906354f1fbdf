"""A rank's input texts and its model label (checker.core.sizing.row): what decides that two ranks were
given the same input, and what the root cause quotes when they were not.

Two ranks whose values differ must get different texts (the digest of the text decides equality, so
two values with one text would pass as the same input), and a text must read as the value the user
gave. Nothing here runs processes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from checker.core.sizing.row import input_text, model_label
from checker.distributed.wire import digest
from checker.families.geometry import load_geometry

# Every type a sizing flag, an environment variable or the budget takes.
VALUES = st.one_of(
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_an_unset_input_stays_unset_and_nothing_given_reads_as_unset() -> None:
    # Unset (None) is how the report says a rank was not given a flag; a given value never reads as
    # unset, and unset never reads as a value.
    assert input_text(None) is None
    for given_value in (0, 0.0, False, "", "None", 8):
        assert input_text(given_value) is not None


@given(a=VALUES, b=VALUES)
def test_values_that_differ_have_texts_and_digests_that_differ(a: object, b: object) -> None:
    if type(a) is type(b) and a != b:
        # Same type, different value: a flag two ranks set differently must not look the same.
        assert input_text(a) != input_text(b)
        assert digest(input_text(a)) != digest(input_text(b))


def test_texts_read_as_the_values_the_user_gave() -> None:
    # The root cause quotes these: a boolean as it is spelled in JSON reports, numbers and strings as
    # written, a float round-tripping exactly (a budget of 0.1 GiB and 0.1000000001 GiB differ).
    assert (input_text(True), input_text(False)) == (json.dumps(True), json.dumps(False))
    assert input_text(8) == "8" and input_text("own-share") == "own-share"
    for budget in (0.1, 0.1000000001, 8.0, 1e-6):
        assert float(input_text(budget)) == budget


def test_a_models_label_is_its_name_and_a_short_digest() -> None:
    # docs/json-output.md: "the name and a digest of the resolved shapes and dtypes" ("kimi-k3 #56a8a0b3").
    label = model_label(load_geometry(model="kimi-k3"))
    assert re.fullmatch(r"kimi-k3 #[0-9a-f]{8}", label), label


def test_one_model_name_with_other_shapes_gets_another_label(tmp_path) -> None:
    # The label digests the model's own definition (its config.json as JSON reads it), not how a rank
    # resolves it: the TP size is its own input (tp_size), so the same model at tp 1 and tp 2 keeps one
    # label, while the same file name with one shape changed gets another.
    tp1, tp2 = load_geometry(model="kimi-k3", tp_size=1), load_geometry(model="kimi-k3", tp_size=2)
    assert tp1.describe() != tp2.describe() and model_label(tp1) == model_label(tp2)
    config = json.loads((FIXTURES / "qwen3_next_80b_a3b.json").read_text())
    one, other = tmp_path / "a" / "config.json", tmp_path / "b" / "config.json"
    heads = config["linear_num_value_heads"]
    for path, value_heads in ((one, heads), (other, 2 * heads)):
        path.parent.mkdir()
        path.write_text(json.dumps({**config, "linear_num_value_heads": value_heads}))
    a, b = load_geometry(model_config=one), load_geometry(model_config=other)
    assert model_label(a).split(" #")[1] != model_label(b).split(" #")[1]
    assert model_label(a) == model_label(load_geometry(model_config=one))
