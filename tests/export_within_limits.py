"""`hf-pretrain export` in a process of its own under a file-size limit and a umask, for the refusal tests.

    python tests/export_within_limits.py FILE_LIMIT UMASK EXPORT_ARGS...

FILE_LIMIT (bytes, 0: none) stands for a full disk: a write past it fails with EFBIG, as one onto a full disk
fails with ENOSPC. A script file, not `python -c`, so the tests start it warm (tests/warm_start.py): the limit
and the umask are set in the export's own process either way.
"""

from __future__ import annotations

import os
import resource
import signal
import sys

if __name__ == "__main__":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) instead of killing
    limit = int(sys.argv[1])
    if limit:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    os.umask(int(sys.argv[2], 8))
    from hf_pretrain.publish import export_command

    sys.exit(export_command.main(sys.argv[3:]))
