"""STATUS= to a reader that falls behind (governor/daemon/notify.py, ticks.py): a message its full queue drops is sent
again with the state then, so the last of a burst of changes reaches it once it reads."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

from governor.daemon import ticks
from governor.daemon.notify import Notifier


def test_a_status_the_full_queue_dropped_is_sent_again_once_the_reader_reads(tmp_path, monkeypatch):
    path = str(tmp_path / "notify")
    reader = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    reader.bind(path)
    reader.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": path})
    jobs = ["a", "b"]
    ctl = SimpleNamespace(gpus={}, jobs=jobs, missing_why=None)
    monkeypatch.setattr(ticks, "STATUS_RETRY_S", 0.01)

    def read_all() -> list[str]:
        got = []
        while True:
            try:
                got.append(reader.recv(4096).decode())
            except BlockingIOError:
                return got

    async def main() -> list[str]:
        ticker = ticks.Ticker(notifier, sample_interval_s=60.0)
        resent = asyncio.Event()
        resend = ticker._resend_status

        def resend_and_tell(ctl) -> None:
            resend(ctl)
            resent.set()

        ticker._resend_status = resend_and_tell  # type: ignore[method-assign]
        while notifier.status("filler"):  # the reader reads nothing yet: its queue fills
            pass
        jobs.clear()  # the last change of a burst (a job's end), told while the queue is full
        ticker._send_status(ctl)
        assert ticker._retry is not None
        before = read_all()  # the reader catches up before the loop runs the retry
        await asyncio.wait_for(resent.wait(), timeout=10)
        assert ticker._retry is None, "the status was sent again, not dropped again"
        ticker.stop()
        return before + read_all()

    got = asyncio.run(main())
    assert "STATUS=0 job(s); no GPU: none found" not in got[:-1] and got[-1] == "STATUS=0 job(s); no GPU: none found"
    reader.close()


def test_a_reloaded_sample_interval_reschedules_the_tick_already_waiting():
    """A reload from sample_interval_s 3600 to 1 took effect only after the hour's tick had fired."""
    ctl = SimpleNamespace(gpus={}, jobs=["a"], missing_why=None, busy=lambda: True, pending_restores=lambda: False,
                          energy=SimpleNamespace(refresh_s=None))

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        ticker = ticks.Ticker(Notifier({}), sample_interval_s=3600.0)
        ticker.changed(ctl)
        old_in_s = ticker._tick.when() - loop.time()
        ticker.set_interval(1.0, ctl)
        new_in_s = ticker._tick.when() - loop.time()
        ticker.stop()
        return old_in_s, new_in_s

    old_in_s, new_in_s = asyncio.run(main())
    assert old_in_s > 3500 and new_in_s <= 1.0
