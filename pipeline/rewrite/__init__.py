"""Graph rewrites and conversions of a model: ONNX -> ONNX transforms (the static stage's surgery,
an ABI's workarounds and speed rewrites, folding, unrolling), and a TFLite or NNEF source -> ONNX.

Pure model-to-model functions over onnx / TFLite graphs, called by the stages (import, static,
golden, iree_compile) and the commands; they import nothing above `spec/`.
"""
