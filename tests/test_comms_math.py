import pytest

from reproflow.families.param_comms.sweep import COLLECTIVES, bus_factor, element_counts, message_sizes


@pytest.mark.parametrize("world", [2, 3, 4])
def test_bus_factors_are_the_nccl_tests_factors(world):
    n = world
    expected = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
        "send_recv": 1.0,
    }
    assert set(expected) == set(COLLECTIVES)
    for collective, factor in expected.items():
        assert bus_factor(collective, world) == pytest.approx(factor)


def test_size_sweep_multiplies_or_steps_inclusively():
    assert message_sizes(8, 64, 2, 0) == [8, 16, 32, 64]
    assert message_sizes(1024, 4096, 2, 1024) == [1024, 2048, 3072, 4096]
    assert message_sizes(1024, 2**26, 2, 0)[-1] == 2**26 and len(message_sizes(1024, 2**26, 2, 0)) == 17


def test_split_collectives_carry_whole_elements_per_rank():
    assert element_counts("all_gather", 8, 4, 4) == (4, 1)  # raised to 1 element per rank
    assert element_counts("reduce_scatter", 1000, 4, 3) == (249, 83)
    assert element_counts("all_reduce", 2, 4, 4) == (1, 1)
    assert element_counts("broadcast", 4096, 2, 4) == (2048, 2048)
