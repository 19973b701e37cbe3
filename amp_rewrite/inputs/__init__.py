"""Input generation: pure functions over the model, which read its graph and change nothing in
it, to say what inputs it takes; ``dims`` is the dimension solver (the extents that a graph
implies for its inputs' named dimensions). The modules of this package import only
``amp_rewrite.ir`` and ``amp_rewrite.errors`` (``tests/test_layers.py`` holds them to it):
running a model, and drawing samples to run it on, belong to the layers above.
"""
