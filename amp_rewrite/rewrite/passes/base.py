"""The pass interface: a pass is a small class whose docstring states the invariant it
establishes, that takes its settings in its constructor and the context it works on in ``run``,
and returns what it changed.

A pass's context is the thing it reads and changes: the model (``InlineFunctions``,
``UpgradeOpset``: they run before the model is indexed), the ``Analysis`` (the coloring passes:
they refine its coloring and edit nothing), or the ``Rewrite`` (the analysis and the stats of the
passes that edit the model). ``pipeline.run_passes`` runs a sequence of them on one context,
timing each under its ``name``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Generic, TypeVar

Context = TypeVar("Context")


@dataclass(frozen=True, slots=True)
class PassResult:
    """What a pass did: ``changed``, whether its context differs from before it ran (a second
    run of the same pass on its own result changes nothing), and ``notes``, the lines it adds to
    the report, in order."""

    changed: bool
    notes: tuple[str, ...] = ()


class Pass(abc.ABC, Generic[Context]):
    """A pipeline step. Its class docstring states its invariant: what holds of the context
    once it has run."""

    @property
    def name(self) -> str:
        """The pass's name, under which the pipeline times it (``Analysis.seconds``)."""
        return type(self).__name__

    @abc.abstractmethod
    def run(self, context: Context) -> PassResult:
        """Establish the invariant on ``context`` (in place); what changed."""
