"""sources.converter_reason: what a converter's output says stopped it (issue 28, item 5: the build
once showed only nnef-tools' last line, `output-shapes: (1, 128)`, not the op and the reason)."""
from __future__ import annotations

from pipeline.rewrite.sources import converter_reason

REFUSED = """Found 1 operator(s) that cannot be converted
Conversion of operator 'l2_normalization' is not possible: axes must be of length 1
  attributes: {'axes': [0, 1], 'bias': 0.0, 'epsilon': 0.0}
  input-shapes: (1, 128)
  output-shapes: (1, 128)

[exit code 255]
"""

TRACEBACK = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/nnef_tools/convert.py", line 277, in main
    graph = reader(args.input_model, **reader_kwargs)
  File "/venv/lib/python3.11/site-packages/nnef/shapes.py", line 576, in infer_shapes
    assert _broadcastable(value.shape, tensor.shape)
AssertionError

[exit code 1]
"""


def test_a_refused_op_is_named_with_its_reason():
    assert converter_reason(REFUSED) == \
        "Conversion of operator 'l2_normalization' is not possible: axes must be of length 1"


def test_several_refused_ops_are_all_named_once():
    text = REFUSED + "Conversion of operator 'REVERSE_V2' is not implemented\n" + REFUSED
    assert converter_reason(text) == ("Conversion of operator 'l2_normalization' is not possible: axes must "
                                      "be of length 1; Conversion of operator 'REVERSE_V2' is not implemented")


def test_a_bare_exception_is_given_with_the_frame_that_raised_it():
    assert converter_reason(TRACEBACK) == ("AssertionError at nnef/shapes.py:576 in infer_shapes "
                                           "(assert _broadcastable(value.shape, tensor.shape))")


def test_anything_else_is_its_last_line():
    assert converter_reason("reading model\nsegmentation fault\n") == "segmentation fault"
    assert converter_reason("") == ""
