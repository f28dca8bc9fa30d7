"""Start moto's server with two fixes that make it behave like the services it
stands in for, under the load of our tests.

1. DynamoDB requests are serialized. Real DynamoDB applies each conditional
   write atomically; moto's threaded server does not, so two pollers racing
   for the same lease could both see their condition hold.
2. SQS queue attributes are computed on demand. moto rebuilds every attribute,
   including the message counts (a scan of the queue), each time it reads one
   of them, which it does for every message sent and received: sending to a
   queue of n messages costs O(n) per message. Reading only the attribute asked
   for keeps sends and receives constant-time, as in SQS.

Other services keep moto's threading. Arguments are moto_server's own.
"""

import collections.abc
import json
import sys
import threading

from moto.core.utils import camelcase_to_underscores
from moto.dynamodb.responses import DynamoHandler
from moto.server import main
from moto.sqs.models import Queue, SQSBackend

_lock = threading.Lock()
_call_action = DynamoHandler.call_action


def _serialized_call_action(self):
    with _lock:
        return _call_action(self)


DynamoHandler.call_action = _serialized_call_action


class _LazyAttributes(collections.abc.Mapping):
    """A queue's attributes, each computed when read."""

    def __init__(self, queue):
        self._queue = queue

    def _names(self):
        q = self._queue
        names = list(q.BASE_ATTRIBUTES)
        if q.fifo_queue:
            names += q.FIFO_ATTRIBUTES
        if q.kms_master_key_id:
            names += q.KMS_ATTRIBUTES
        if q.policy:
            names.append("Policy")
        if q.redrive_policy:
            names.append("RedrivePolicy")
        return names

    def __getitem__(self, name):
        if name not in self._names():
            raise KeyError(name)
        q = self._queue
        if name == "Policy":
            return q.policy
        if name == "RedrivePolicy":
            return json.dumps(q.redrive_policy)
        value = getattr(q, camelcase_to_underscores(name))
        if isinstance(value, bool):
            value = str(value).lower()
        return value

    def __iter__(self):
        return iter(self._names())

    def __len__(self):
        return len(self._names())


Queue.attributes = property(lambda self: _LazyAttributes(self))
_get_queue_attributes = SQSBackend.get_queue_attributes


def _get_queue_attributes_dict(self, queue_name, attribute_names):
    return dict(_get_queue_attributes(self, queue_name, attribute_names))


SQSBackend.get_queue_attributes = _get_queue_attributes_dict

if __name__ == "__main__":
    main(sys.argv[1:])
