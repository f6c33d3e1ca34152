import pytest

from reproflow.spec.errors import ParamError
from reproflow.spec.params import Param, canonical, format_size, parse_size, resolve


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8", 8), (8, 8), ("1K", 1024), ("64M", 64 * 2**20), ("2G", 2**31), ("2GB", 2**31), ("64MiB", 64 * 2**20),
     ("1k", 1024), ("0", 0)],
)
def test_sizes_parse_as_param_does(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["1.5G", "G", "-1", "1T", True, -4, "64 MB extra"])
def test_bad_sizes_are_rejected_with_the_allowed_forms(bad):
    with pytest.raises(ParamError) as err:
        parse_size(bad)
    assert "K, M or G" in str(err.value) or "0 bytes or more" in str(err.value)


def test_format_size_inverts_parse_size():
    for n in (1, 1000, 1024, 3 * 2**20, 2**31):
        assert parse_size(format_size(n)) == n


def test_param_checks_type_choice_and_range():
    p = Param("iters", "int", 5, "x", minimum=1, maximum=10)
    assert p.coerce(3) == 3
    for bad in ("3", 3.0, True, 0, 11):
        with pytest.raises(ParamError):
            p.coerce(bad)
    c = Param("op", "str", "a", "x", choices=("a", "b"))
    with pytest.raises(ParamError, match="one of 'a', 'b'"):
        c.coerce("z")


def test_resolve_names_the_unknown_or_bad_parameter():
    params = (Param("a", "int", 1, "x"), Param("b", "bool", False, "x"))
    assert resolve(params, {"b": True}) == {"a": 1, "b": True}
    with pytest.raises(ParamError, match="'c' is not a parameter"):
        resolve(params, {"c": 1})
    with pytest.raises(ParamError, match="'b'"):
        resolve(params, {"b": "yes"})


def test_int_lists_and_canonical_form():
    p = Param("shapes", "int-lists", [], "x")
    assert p.coerce([[1, 2, 3]]) == ((1, 2, 3),)
    assert canonical(((1, 2, 3), (4, 5, 6))) == "1x2x3;4x5x6"
    with pytest.raises(ParamError):
        p.coerce([[1, -2]])
