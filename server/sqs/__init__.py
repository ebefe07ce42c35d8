"""The SQS-compatible HTTP gateway (``lamina serve --sqs-port PORT``): Amazon SQS's API
(2012-11-05, AWS JSON 1.0 and Query) over the server's own request path."""

from .http import SqsGateway

__all__ = ["SqsGateway"]
