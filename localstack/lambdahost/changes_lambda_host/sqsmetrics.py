"""Queue metrics without per-call metrics.

LocalStack's SQS, unless SQS_DISABLE_CLOUDWATCH_METRICS is set, publishes
two kinds of CloudWatch metrics: every queue's approximate depths
(ApproximateNumberOfMessagesVisible and the like) once a reporting
interval, and a metric for every SendMessage, ReceiveMessage and
DeleteMessage call it serves, through its own CloudWatch API from a
thread pool. The alarms of a deployed stack (a DLQ holding messages) need
the first kind; the second costs a core for minutes after a benchmark's
hundreds of thousands of messages. With SQS_CALL_METRICS=0 this hook turns
the second kind off and keeps the first.
"""

import os

from localstack.runtime import hooks


@hooks.on_infra_start()
def _sqs_without_call_metrics() -> None:
    if os.environ.get("SQS_CALL_METRICS", "1") != "0":
        return
    from localstack.services.sqs.provider import CloudwatchDispatcher

    def dispatch_nothing(self, *args, **kwargs) -> None:
        pass

    CloudwatchDispatcher.dispatch_sqs_metric = dispatch_nothing
