"""Time-boxed runs: stop at a safe point when the time is nearly used, resume on the next call.

A lent GPU gives a command ten minutes; ``ccu run --stop-after SECONDS`` makes a run fit: it sets
a :class:`Deadline`, and the work stops with :class:`StopForTime` at the next safe point that
would otherwise end past it:

* between methods, and before the attack: when the deadline has passed (``ccu run`` checks
  with :meth:`Deadline.stop_if_passed`, once the call has done some work: every call makes
  progress, however short its time; :class:`TimeBox`);
* after an epoch whose checkpoint is saved: when another epoch as long as the last one would end
  after the deadline. :meth:`Deadline.epoch_callback` is the training's epoch callback there
  (``on_epoch_end`` of :func:`ccu.methods.training.run_epochs`, passed down by ``ccu run``); it times the
  first epoch from the start of the epoch loop, not from the start of the method (building a
  CCU model fits its mixtures first: a minute on the full MNIST)::

      Trainer(...).fit(model, data, checkpoint=path, on_epoch_end=deadline.epoch_callback())

Everything finished is on disk (per-method results, the epoch's checkpoint), so the same command
run again resumes where this one stopped. This module imports nothing of ``ccu``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: the clock of every :class:`Deadline` that is given none (tests replace it)
clock: Callable[[], float] = time.monotonic


class StopForTime(Exception):
    """The run stopped at a safe point because its time is (nearly) used; what it finished is
    saved, and the same command run again continues from there."""

    def __init__(self, where: str, deadline: Deadline | None = None):
        self.where = where
        self.deadline = deadline
        spent = f" after {deadline.elapsed():.0f} s of {deadline.seconds:g} s" if deadline else ""
        super().__init__(f"stopped for time{spent} ({where})")


class NotInTime(StopForTime):
    """A training that, timed over its first epochs, would end past its ``finish_by`` (the
    last moment its attack can still follow within the call): stopped after a saved epoch,
    with its measured :attr:`epoch_seconds`, so that the caller can start it again with as
    many epochs as fit (``tools/lease_run.sh``: a reduced variant sized anew)."""

    def __init__(self, where: str, deadline: Deadline, epoch_seconds: float):
        self.epoch_seconds = epoch_seconds
        super().__init__(where, deadline)


class Deadline:
    """``seconds`` from now (on ``clock``). :meth:`check` after each saved unit of work (an
    epoch) stops when one more unit as long as the last would end after the deadline; a unit
    is timed from the previous check (or :meth:`stop_if_passed`, or the start).

    ``finish_by`` (seconds from now, at most ``seconds``): after unit 2 (the first is timed
    with the start's one-off costs), and again after unit 3, :meth:`check` also stops with
    :class:`NotInTime` when the units left, each as long as the last, would end past it.

    >>> t = [0.0]
    >>> d = Deadline(100, clock=lambda: t[0], finish_by=50)
    >>> t[0] = 10; d.check(1, 10)    # unit 1: not judged
    >>> t[0] = 16; d.check(2, 10)    # 6 s a unit: 8 more end at 64 s, past 50 s
    Traceback (most recent call last):
    ...
    ccu.run.deadline.NotInTime: stopped for time after 16 s of 100 s (after 2 of 10; the 8 left, 6 s each, would end at 64 s, past 50 s)
    """

    #: the units after which ``finish_by`` is judged (the first is not: it holds set-up costs)
    judged_units = (2, 3)

    def __init__(self, seconds: float, clock: Callable[[], float] | None = None,
                 finish_by: float | None = None):  # fmt: skip
        if not seconds > 0:
            raise ValueError(f"a deadline needs a positive number of seconds, not {seconds!r}.")
        if finish_by is not None and not 0 < finish_by <= seconds:
            raise ValueError(
                f"finish_by must be positive and at most the deadline's {seconds:g} s, "
                f"not {finish_by!r}."
            )
        self.seconds = float(seconds)
        self.finish_by = None if finish_by is None else float(finish_by)
        self._clock = clock
        self.start = self.now()
        self.end = self.start + self.seconds
        self._mark = self.start

    def now(self) -> float:
        return (self._clock or clock)()

    def elapsed(self) -> float:
        return self.now() - self.start

    def remaining(self) -> float:
        return self.end - self.now()

    def passed(self) -> bool:
        return self.remaining() <= 0

    def stop_if_passed(self, before: str) -> None:
        """Raise :class:`StopForTime` when the deadline has passed (called between methods and
        phases: ``before`` names what would start); else start timing the next unit."""
        if self.passed():
            raise StopForTime(f"before {before}", self)
        self.lap()

    def lap(self) -> None:
        """Start timing the next unit of work now."""
        self._mark = self.now()

    def check(self, done: int | None = None, total: int | None = None) -> None:
        """After a unit of work whose state is saved (``done`` of ``total``, e.g. epochs; the
        signature of the training's ``on_epoch_end`` callback):
        raise :class:`StopForTime` when another unit as long as this one would end after the
        deadline. Nothing is raised after the last unit (``done >= total``): that work is
        finished, and stopping would only postpone saving it."""
        now = self.now()
        step, self._mark = now - self._mark, now
        if done is not None and total is not None and done >= total:
            return
        if now + step > self.end:
            where = f"after {done} of {total}" if done is not None else "after a saved step"
            raise StopForTime(f"{where}; the next would end past the deadline", self)
        if self.finish_by is not None and done in self.judged_units:
            ends = now + (total - done) * step - self.start
            if ends > self.finish_by:
                raise NotInTime(
                    f"after {done} of {total}; the {total - done} left, {step:.3g} s each, "
                    f"would end at {ends:.0f} s, past {self.finish_by:g} s",
                    self,
                    step,
                )

    def epoch_callback(self) -> EpochDeadline:
        """The ``on_epoch_end`` of a training under this deadline (:class:`EpochDeadline`)."""
        return EpochDeadline(self)


class EpochDeadline:
    """A training's epoch callback (``on_epoch_end(done, total)``) that stops it with
    :class:`StopForTime` when another epoch as long as the last would end past ``deadline``
    (:meth:`Deadline.check`). :func:`ccu.methods.training.run_epochs` calls :meth:`before_epochs` before
    its first epoch, so that the first epoch is timed alone, without the model's construction
    (a deadline of 100 s, 80 s spent fitting a CCU model's mixtures, 2 s an epoch: the check
    after the first epoch estimates 2 s, not 82 s, and the training goes on)."""

    def __init__(self, deadline: Deadline):
        self.deadline = deadline
        self._decided: tuple[int | None, StopForTime | None] | None = None

    def before_epochs(self) -> None:
        self.deadline.lap()

    def stops_after(self, done: int | None = None, total: int | None = None) -> bool:
        """Whether the training stops after epoch ``done`` (:meth:`Deadline.check`, now),
        asked by the epoch loop before it writes the epoch's checkpoint: an epoch the training
        stops after is always saved. The call that follows for the same epoch acts on this
        decision, so the two cannot disagree (the checkpoint's write in between takes time)."""
        try:
            self.deadline.check(done, total)
        except StopForTime as stop:
            self._decided = (done, stop)
            return True
        self._decided = (done, None)
        return False

    def __call__(self, done: int | None = None, total: int | None = None) -> None:
        decided, self._decided = self._decided, None
        if decided is not None and decided[0] == done:
            if decided[1] is not None:
                raise decided[1]
            return
        self.deadline.check(done, total)

    def __eq__(self, other) -> bool:
        return isinstance(other, EpochDeadline) and other.deadline is self.deadline

    __hash__ = None


class TimeBox:
    """``--stop-after``'s stops: between methods and phases (:meth:`stop_before`) once the
    deadline has passed, and only after this call trained something (so that every call makes
    progress); after a saved epoch, :attr:`on_epoch_end`, the callback the training gets."""

    def __init__(self, deadline):
        self.deadline = deadline
        self.worked = False

    @property
    def on_epoch_end(self):
        """The deadline's :meth:`Deadline.epoch_callback` for the trainer's
        ``on_epoch_end`` (stop after an epoch when another as long would end past the deadline);
        None without a deadline."""
        return None if self.deadline is None else self.deadline.epoch_callback()

    def stop_before(self, what: str) -> None:
        if self.deadline is None:
            return
        if self.worked:
            self.deadline.stop_if_passed(what)
        else:
            self.deadline.lap()
