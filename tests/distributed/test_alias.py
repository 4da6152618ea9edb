"""`tierfeed.dist` is a deprecated alias of `tierfeed.distributed` for one release."""

from __future__ import annotations

import subprocess
import sys


def test_old_name_warns_and_gives_the_same_modules() -> None:
    code = (
        "import sys, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import tierfeed.dist as old\n"
        "    from tierfeed.dist.inbox import Inbox\n"
        "import tierfeed.distributed as new\n"
        "from tierfeed.distributed.inbox import Inbox as NewInbox\n"
        "assert any(issubclass(w.category, DeprecationWarning) for w in caught), caught\n"
        "assert old.Comm is new.Comm and Inbox is NewInbox\n"
        "assert sys.modules['tierfeed.dist.inbox'] is sys.modules['tierfeed.distributed.inbox']\n"
    )
    # A fresh interpreter: the warning is given once, at the first import of the old name.
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
