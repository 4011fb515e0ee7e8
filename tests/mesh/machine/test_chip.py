"""ChipSpec: defaults from trn2_facts.md, invariants, per-dtype peak rates."""

import pytest

from mesh import ChipSpec

FP8_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3", "float8_e3m4")


def test_defaults_match_trn2_facts():
    chip = ChipSpec()
    assert (chip.neuron_cores, chip.pe_rows, chip.pe_cols) == (8, 128, 128)
    assert chip.tensor_clock_hz == 2.4e9
    assert chip.psum_bytes_per_core == 2 * 2**20
    assert chip.hbm_bytes == 96 * 2**30
    # 8 cores x 128 x 128 PEs x 2 FLOPs x 2.4 GHz: the timing model's peak is the MFU one
    assert chip.peak_flops_for("bfloat16") == 8 * 128 * 128 * 2 * 2.4e9


def test_spec_is_hashable_and_frozen():
    assert hash(ChipSpec()) == hash(ChipSpec())
    with pytest.raises(AttributeError):
        ChipSpec().pe_rows = 64


def test_override_takes_effect():
    assert ChipSpec(tensor_clock_hz=1.0e9).tensor_clock_hz == 1.0e9


@pytest.mark.parametrize("field", ["tensor_clock_hz", "vector_clock_hz", "hbm_bandwidth", "pe_cols",
                                   "host_link_bandwidth"])
def test_non_positive_field_raises_with_value(field):
    with pytest.raises(ValueError, match=rf"{field} must be positive, got -3"):
        ChipSpec(**{field: -3})


def test_inconsistent_psum_shows_the_numbers():
    with pytest.raises(ValueError, match=r"psum_bytes_per_core=2097152 .* = 1048576"):
        ChipSpec(psum_banks=4)


def test_psum_override_consistent_is_accepted():
    assert ChipSpec(psum_banks=4, psum_bytes_per_core=2**20).psum_banks == 4


def test_pe_rows_beyond_partitions_raises():
    with pytest.raises(ValueError, match=r"pe_rows=256 exceeds sbuf_partitions=128"):
        ChipSpec(pe_rows=256)


def test_duplicate_or_non_positive_rate_raises():
    with pytest.raises(ValueError, match="more than once"):
        ChipSpec(matmul_rates=(("bfloat16", 1.0), ("bfloat16", 2.0)))
    with pytest.raises(ValueError, match=r"'float32'.*got 0"):
        ChipSpec(matmul_rates=(("bfloat16", 1.0), ("float32", 0)))
    with pytest.raises(ValueError, match="rate reference"):
        ChipSpec(matmul_rates=(("bfloat16", 2.0),))


def test_negative_host_round_trip_raises():
    with pytest.raises(ValueError, match=r"host_round_trip_seconds must be >= 0, got -1"):
        ChipSpec(host_round_trip_seconds=-1)


@pytest.mark.parametrize("rates", [((1, 1.0),), ((1, 1.0), (2, 0.0)), ((1, 1.0), (3, 0.5))])
def test_vector_rates_need_positive_rates_for_one_and_two_operands(rates):
    with pytest.raises(ValueError, match=r"vector_rates must give positive rates"):
        ChipSpec(vector_rates=rates)


def test_unknown_dtype_names_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"'complex64'.*bfloat16.*int8"):
        ChipSpec().peak_flops_for("complex64")


@pytest.mark.parametrize("name", FP8_NAMES + ("int8",))
def test_fp8_peak_is_twice_bf16(name):
    chip = ChipSpec()
    assert chip.peak_flops_for(name) == 2 * chip.peak_flops_for("bfloat16")
    assert chip.matmul_rate_factor(name) == 2.0


def test_rate_factors_relative_to_bf16():
    chip = ChipSpec()
    assert chip.matmul_rate_factor("bfloat16") == 1.0
    assert chip.matmul_rate_factor("float16") == 1.0
    assert chip.matmul_rate_factor("float32") == 0.25
    assert chip.peak_flops_for("float32") == chip.peak_flops_for("bfloat16") / 4


def test_peaks_follow_the_array_and_an_overridden_table():
    chip = ChipSpec(neuron_cores=1, tensor_clock_hz=1e9, matmul_rates=(("bfloat16", 1.0),
                                                                      ("float32", 0.5)))
    assert chip.peak_flops_for("bfloat16") == 128 * 128 * 2 * 1e9
    assert chip.matmul_rate_factor("float32") == 0.5
