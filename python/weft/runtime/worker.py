"""A local rank process of weft.run: ``python -m weft.runtime.worker TMP RANK WORLD PORT``."""
import os
import sys

from weft.runtime.launch import worker_main

if __name__ == "__main__":
    code = worker_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave at once: tearing down a process group whose peers failed can block.
    os._exit(code)
