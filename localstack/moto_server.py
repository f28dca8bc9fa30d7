"""Start moto's server with DynamoDB requests serialized.

Real DynamoDB applies each conditional write atomically; moto's threaded server
does not, so two pollers racing for the same lease could both see their
condition hold. Running DynamoDB requests one at a time restores the guarantee
our lease relies on (other services keep moto's threading, so SQS long polls do
not block each other). Arguments are moto_server's own.
"""

import sys
import threading

from moto.dynamodb.responses import DynamoHandler
from moto.server import main

_lock = threading.Lock()
_call_action = DynamoHandler.call_action


def _serialized_call_action(self):
    with _lock:
        return _call_action(self)


DynamoHandler.call_action = _serialized_call_action

if __name__ == "__main__":
    main(sys.argv[1:])
