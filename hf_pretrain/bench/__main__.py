"""`python -m hf_pretrain.bench`: the command, and the worker each variant's child process runs."""

import sys

from hf_pretrain.bench.bench_command import main

sys.exit(main())
