"""What a hook module may use of the capture that installed it: :class:`HookContext`.

Why: the hooks (API wrappers, module hooks, autograd hooks, DDP's communication hook, the
records waiting for a collective) moved out of the ``Debugger`` but kept reaching back into
it, for its recorder and for 25 of its private attributes at over a hundred sites, and each
hook module imported the Debugger's type, which imported the hook modules: following one
captured call crossed five files, and most of the package was one import circle. A hook now
gets this narrow context instead: the :class:`~.recorder.Recorder` that turns tensors into
records, the lock and guard every entry point takes, the selection and the collectives'
counters it numbers calls with, and a few facts about the capture's state. The Debugger
holds the object that implements it (``debugger._Context``); no hook module imports the
Debugger.

Everything here is read-only to a hook: what it changes it changes through the recorder,
the selection or the counters.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from .._guard import Guard
from ..config import CaptureConfig
from .collectives import Collectives
from .recorder import Recorder
from .selection import Selection


class HookContext(Protocol):
    """The state a Debugger's hooks share."""

    @property
    def config(self) -> CaptureConfig:
        """The capture configuration."""
        ...

    @property
    def recorder(self) -> Recorder:
        """Tensors to records, records to the dump (statistics, dataflow, stacks, files)."""
        ...

    @property
    def lock(self) -> AbstractContextManager[bool]:
        """Held while a hook records (hooks run on autograd's and the backends' threads)."""
        ...

    @property
    def guard(self) -> Guard:
        """Where a hook's exception goes: capture off for the rest of the run."""
        ...

    @property
    def select(self) -> Selection:
        """What is captured, and this step's call counters."""
        ...

    @property
    def collectives(self) -> Collectives:
        """This step's sequence numbers of collectives (``coll_seq``)."""
        ...

    @property
    def running(self) -> bool:
        """Between ``start()`` and ``stop()`` of a captured step."""
        ...

    @property
    def api_on(self) -> bool:
        """Whether API calls are captured now (running at api or mix level)."""
        ...

    @property
    def session(self) -> int:
        """How many times ``start()`` began capturing: a hook of an earlier session (a late
        gradient of a closed step) does nothing."""
        ...

    @property
    def current_step(self) -> int:
        """The step being captured (for messages)."""
        ...

    def note_transform(self, what: str) -> None:
        """A call of ``what`` inside a ``torch.func`` transform was not captured: the user
        is told once."""
        ...

    def tell_once(self, what: str, msg: str, stacklevel: int) -> None:
        """Log and warn ``msg`` the first time something of kind ``what`` happens
        (``stacklevel``: the warning's, counted from the implementation's ``warn``)."""
        ...
