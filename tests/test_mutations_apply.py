"""The mutation check's edits still apply: each old text occurs exactly once in its file.

``make mutate`` (tests/mutations.py) refuses a mutation whose text moved, but it is not part of ``make test``;
without this, a change to the package silently leaves mutations that no longer apply (three did in session 36:
the code they broke had been rewritten or copied).
"""

from __future__ import annotations

import os

import pytest

from tests import mutations

ROOT = mutations.ROOT


@pytest.mark.parametrize("mutation", mutations.MUTATIONS, ids=lambda m: m.name[:60])
def test_each_mutations_text_occurs_exactly_once_in_its_file(mutation):
    with open(os.path.join(ROOT, mutation.path)) as file:
        count = file.read().count(mutation.old)
    assert count == 1, f"{mutation.name!r}: its old text occurs {count} times in {mutation.path}; rewrite the mutation"


def test_each_mutations_tests_exist():
    for mutation in mutations.MUTATIONS:
        for test in mutation.tests:
            path, _, name = test.partition("::")
            with open(os.path.join(ROOT, path)) as file:
                assert not name or f"def {name.split('[')[0]}(" in file.read(), f"{mutation.name!r}: no test {test}"
