"""modelyard: a cached, reproducible build of ML models into validated firmware artifacts.

Stages live one per module (import_model, static, golden, iree_compile, validate, manifest);
`steps` runs any of them under a content-addressed key; `dodo.py` only wires them into doit.
Heavy toolchains (onnx, onnxruntime, IREE) are imported inside stage functions so that
`doit list` and a no-op build stay fast.
"""
