import warnings

warnings.filterwarnings("ignore", category=RuntimeWarning, module="onnx.backend.test.case.node")
