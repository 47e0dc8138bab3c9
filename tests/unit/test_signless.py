"""IREE's integers are signless: a uint8 output comes back as int8 with the same bytes, and is
read back as the declared type (validation and the app runner), bit for bit; nothing else is."""
import numpy as np

from pipeline.stages.validate import signless


def test_same_width_integers_are_read_as_the_declared_type_bit_for_bit():
    golden = np.array([0, 127, 128, 255], np.uint8)
    back = golden.view(np.int8)                       # what IREE's runtime hands back
    read = signless(back, golden)
    assert read.dtype == np.uint8 and np.array_equal(read, golden)
    assert signless(np.array([-1], np.int32), np.array([1], np.uint32)).tolist() == [2**32 - 1]


def test_other_dtype_differences_are_left_for_the_comparison_to_report():
    for actual, golden in ((np.zeros(2, np.int16), np.zeros(2, np.uint8)),
                           (np.zeros(2, np.float32), np.zeros(2, np.int32)),
                           (np.zeros(2, np.float16), np.zeros(2, np.float32))):
        assert signless(actual, golden).dtype == actual.dtype
