"""nnef-tools custom converters (loaded by module name: --custom-converters pipeline.nnef_fixes).

nnef-tools 1.0.11 converts TFLite PRELU without moving its alpha to the NCHW layout it moves the
activations to: alpha [1, 1, C] against x [1, C, H, W] fails NNEF shape inference (seen on
mediapipe face_landmark). Here alpha goes through the same `convert_binarg` as ADD's second
operand, which transposes or reshapes it to match.
"""
from nnef_tools.conversion.converter import Transform

CUSTOM_TRANSFORMS = {
    "PRELU": Transform(type="prelu", inputs=("!I[0]", "!convert_binarg(I[1], I[0])"),
                       outputs="!transpose_like(O[0], I[0])"),
}

# SELECT_V2 (TFLite's broadcasting select, in basic-pitch) has no transform in nnef-tools 1.0.11;
# NNEF `select` broadcasts, so SELECT's transform (operands brought to the condition's layout) fits.
CUSTOM_TRANSFORMS["SELECT_V2"] = Transform(
    type="select", inputs=("!I[0]", "!convert_binarg(I[1], I[0])", "!convert_binarg(I[2], I[0])"),
    outputs="!transpose_like(O[0], ref=I[0])")
