"""What the long-running archive commands (compute, xvector-compute) share: the
progress display, SIGTERM handling and the accepted --use-gpu values."""

from __future__ import annotations

import sys

USE_GPU_CHOICES = ("yes", "no", "optional", "wait")


class Progress:
    """Utterances done, on stderr when it is a terminal (tqdm when installed)."""

    def __init__(self, total: int | None):
        self.bar = None
        self.count = 0
        self.active = sys.stderr.isatty()
        if self.active:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="utt", file=sys.stderr, leave=False)
            except ImportError:
                pass

    def update(self, key: str) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.active:
            sys.stderr.write(f"\r{self.count} utterances ({key})\x1b[K")
            sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.active and self.count:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class Terminated(KeyboardInterrupt):
    """SIGTERM: the run stops as on Ctrl-C (the output temporaries are removed)."""


def on_sigterm(signum, frame):
    """SIGTERM handler: stop the run as Ctrl-C does."""
    raise Terminated
