"""Serving the kubelet: DRA and plugin-registration gRPC servers (``grpc_server``, over the protos in
``proto``), handover between two instances of one node (``handover``), ``/metrics`` and ``/readyz``
(``http_server``).

May import: ``health`` (the health stream's types), ``prepare``, ``core``, ``api``. Imported by: ``__main__``.
"""
