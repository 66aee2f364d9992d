"""moto's server mode for the SQS tests, with one race closed.

moto's Queue.delete_message rebuilds the queue's list of messages and assigns it back, with no
lock: two DeleteMessage calls at once (or a delete and a SendMessage) can put back a message
the other deleted, or drop a message just sent. A lost delete makes a settled message come back
after its visibility timeout, which SQS itself does not do for a delete it acknowledged. Here
every change to a queue's list of messages is made under one lock; the rest is moto as shipped.

Run as `python moto_sqs.py -H 127.0.0.1 -p 9324`, with the arguments of moto_server.
"""

import sys
import threading

from moto.server import main
from moto.sqs import models

_LOCK = threading.RLock()


def _locked(method):
    def run_locked(self, *args, **kwargs):
        with _LOCK:
            return method(self, *args, **kwargs)

    run_locked.__name__ = method.__name__
    return run_locked


models.Queue.delete_message = _locked(models.Queue.delete_message)
models.Queue.add_message = _locked(models.Queue.add_message)

if __name__ == "__main__":
    sys.exit(main())
