"""The dimension solver: extents that a graph implies for its inputs' symbolic dimensions.

Generated inputs give a named dimension one extent everywhere (``batch`` = 8), which breaks a
model that reshapes ``batch x 16`` to a fixed [1, 4, 64]: the graph says ``batch`` is 4.
``implied_dims`` reads such bindings off the graph.

The modules, lowest first: ``symbols`` (a dimension's form, a name's binding, their
arithmetic), ``bindings`` and ``counting`` (what the rules share and tell: the bindings, and the
counts that shapes share), ``registry`` (``@rule("Reshape", ...)``), one module per family of
rules (``reshape``, ``windows``, ``broadcast``, ``slicing``, ``control``), and ``driver``
(``implied_dims``: shape inference, the rules in rounds, then the guesses). Importing this
package registers every rule.
"""

from amp_rewrite.inputs.dims import broadcast, control, reshape, slicing, windows  # noqa: F401 (registers the rules)
from amp_rewrite.inputs.dims.driver import implied_dims, total_stride, unnamed_dim
from amp_rewrite.inputs.dims.symbols import AT_LEAST, AT_MOST, Pin

__all__ = ["AT_LEAST", "AT_MOST", "Pin", "implied_dims", "total_stride", "unnamed_dim"]
