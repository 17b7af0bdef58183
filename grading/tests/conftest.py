"""What the handout's tests share: a handout built from this checkout, once per module."""
import pytest

import make_handout


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """A handout built from this checkout."""
    folder = tmp_path_factory.mktemp("handout") / "out"
    assert make_handout.main([str(folder)]) == 0
    return str(folder)
