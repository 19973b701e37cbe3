"""Fused and recurrent ops lowered to the ops they are made of, for the rules to differentiate:
ONNX Runtime's fused contrib ops (``unfused``), LSTM/GRU/RNN unrolled (``recurrent``), Scan bodies
(``scan``)."""
