from localstack.services.lambda_.invocation.plugins import RuntimeExecutorPlugin


class HostRuntimeExecutorPlugin(RuntimeExecutorPlugin):
    """Registers the host executor under the name "host"."""

    name = "host"

    def load(self, *args, **kwargs):
        from changes_lambda_host.executor import HostRuntimeExecutor

        return HostRuntimeExecutor
