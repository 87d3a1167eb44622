"""Which arena page versions a cluster's driver keeps: one :class:`VersionKeeper` per cluster.

Every stage reads the arena at an *epoch*: the driver pager seals a new one when a
stage begins, write-protecting the used pages, so that the first later driver write
to a page copies its old bytes into the version log. A stage may also *replay* an
older epoch (lineage recovery, ``Cluster.run_stage(epoch=)``), reading each page at the
latest version not newer than it. The keeper decides what the log keeps:

- **pins**: :meth:`VersionKeeper.keep` holds an epoch's versions while a block runs
  (``Cluster.keep_versions``, a checkpoint being written);
- **lineage**: the oldest epoch that recomputing a live partition would read
  (``LineageStore.oldest_needed_epoch``);
- **release**: after a stage that nothing will read again (no pin, no lineage, no
  outputs that keep lineage), the driver's writes until the next stage need no copy of
  the old bytes (:meth:`VersionKeeper.stage_ended`): a parameter server's update is an
  in-place write. A replay of a released epoch is refused from then on;
- **trim**: versions older than every epoch still needed go (:meth:`VersionKeeper.trimmable`,
  then :meth:`VersionKeeper.trim` once no earlier attempt can read them).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Protocol

from clamor.runtime.errors import ClamorError
from clamor.runtime.paging.paging_api import DriverPaging


class NeedsVersions(Protocol):
    """Something that will read old epochs again (a runner's lineage store)."""

    def oldest_needed_epoch(self) -> int | None:
        """The oldest epoch it may still read, or ``None``."""
        ...


class VersionKeeper:
    """Epoch pins, release and trimming of one cluster's version log (module docstring).

    ``paging``: the driver pager whose log it manages; ``lineage``: the runner's lineage,
    whose oldest needed epoch the log keeps.
    """

    def __init__(self, paging: DriverPaging, lineage: NeedsVersions | None = None) -> None:
        self._paging = paging
        self._lineage = lineage
        self._pins: collections.Counter[int] = collections.Counter()
        self._released = 0  # epochs <= it are read by no stage any more
        self._trimmed = 0  # versions only epochs < it read are gone

    def floor(self, epoch: int) -> int:
        """The oldest epoch any stage may still read, with ``epoch`` the newest: pinned
        ones, lineage's, ``epoch``."""
        needed = [epoch, *self._pins]
        if self._lineage is not None and (oldest := self._lineage.oldest_needed_epoch()) is not None:
            needed.append(oldest)
        return min(needed)

    @contextlib.contextmanager
    def keep(self, epoch: int) -> Iterator[None]:
        """Keep the page versions ``epoch`` reads while the block runs (:meth:`pin`)."""
        self.pin(epoch)
        try:
            yield
        finally:
            self.unpin(epoch)

    def pin(self, epoch: int) -> None:
        """Keep the page versions ``epoch`` reads until :meth:`unpin`. :class:`ClamorError`
        if they are gone already: the driver wrote pages after that epoch's stage, when
        nothing pinned it."""
        self._pins[epoch] += 1  # first: a stage ending meanwhile sees the pin
        try:
            self._retain(epoch)
        except BaseException:
            self.unpin(epoch)
            raise

    def unpin(self, epoch: int) -> None:
        """Undo one :meth:`pin` of ``epoch``."""
        self._pins[epoch] -= 1
        if not self._pins[epoch]:
            del self._pins[epoch]

    def pinned(self) -> list[int]:
        """The epochs pinned now, oldest first."""
        return sorted(self._pins)

    def _retain(self, epoch: int) -> None:
        """Undo ``epoch``'s release, or raise if the driver wrote since without keeping the old bytes."""
        if epoch <= self._released:
            if not self._paging.retain(epoch):
                raise ClamorError(
                    f"cannot keep the page versions of epoch {epoch}: nothing pinned them when "
                    "its stage ended, and the driver has written arena pages since without "
                    "keeping the old bytes (pin an epoch with keep_versions before writing)"
                )
            self._released = epoch - 1

    def check_replay(self, epoch: int) -> None:
        """:class:`ClamorError` unless a stage may still read the arena at ``epoch``."""
        if epoch < self._trimmed or epoch <= self._released:
            raise ClamorError(
                f"cannot replay epoch {epoch}: its page versions were freed (the version log "
                f"keeps epochs >= {max(self._trimmed, self._released + 1)}, and the ones "
                "pinned by keep_versions or by lineage)"
            )

    def stage_ended(self, epoch: int, *, replay: bool, keeps_lineage: bool) -> None:
        """A stage at ``epoch`` ended (``replay``: an older epoch it read; ``keeps_lineage``:
        its runner records lineage of its outputs next): release the epoch if nothing will
        read it again."""
        if not replay and not keeps_lineage and self.floor(epoch + 1) > epoch:
            self._paging.release(epoch)
            self._released = epoch

    def trimmable(self, epoch: int) -> int | None:
        """The floor to trim the log to as the stage at ``epoch`` begins, or ``None`` if
        nothing would go. The caller must first make sure that no attempt of an earlier
        stage still reads (a barrier to every worker), then call :meth:`trim`."""
        if not self._paging.version_log_bytes():
            return None  # nothing to free: spare the walk over lineage
        floor = min(epoch, self.floor(epoch))
        return floor if floor > self._trimmed else None

    def trim(self, floor: int) -> None:
        """Free the versions that only epochs before ``floor`` read."""
        self._paging.trim_versions(floor)
        self._trimmed = floor
