"""The planted-bug check stays runnable: every plant still matches the code it breaks."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutants.plants import PLANTS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("plant", PLANTS, ids=[p.bug for p in PLANTS])
def test_each_plant_matches_the_code_and_changes_it(plant) -> None:
    source = (ROOT / plant.module).read_text()
    planted = plant.apply(source)
    assert planted != source
    compile(planted, plant.module, "exec")  # a plant is a bug, not a syntax error
    for test in plant.tests:
        assert (ROOT / test.split("::")[0]).is_file(), test
        if "::" in test:
            name = test.split("::")[1].split("[")[0]
            assert f"def {name}(" in (ROOT / test.split("::")[0]).read_text(), test
