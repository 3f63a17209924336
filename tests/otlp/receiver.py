"""An OTLP/HTTP receiver for the traces test (tests/api/traces.rs): decodes what chime
exports with the OpenTelemetry project's own protobuf definitions (PyPI's
`opentelemetry-proto`, which tests/setup.sh installs into target/otlp-venv).

    receiver.py OUT

Listens on a free port of 127.0.0.1 and prints it as the first line on stdout. Each
POST /v1/traces is decoded as an ExportTraceServiceRequest and each of its spans
appended to OUT as one JSON line: ids in hex, the kind's and the status' names, the
attributes as a map, and the resource's service.name. Answered 200 with an empty
ExportTraceServiceResponse, as a collector answers.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

OUT = sys.argv[1]


def value(any_value):
    """An AnyValue as the JSON value it holds."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind in ("array_value", "kvlist_value", "bytes_value"):
        return MessageToDict(any_value)
    return getattr(any_value, kind)


def attributes(key_values):
    return {kv.key: value(kv.value) for kv in key_values}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(404 if self.path != "/v1/traces" else 415)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        lines = []
        for resource_spans in request.resource_spans:
            resource = attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    lines.append(
                        {
                            "service": resource.get("service.name"),
                            "scope": scope_spans.scope.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "name": span.name,
                            "kind": Span.SpanKind.Name(span.kind),
                            "start_ns": span.start_time_unix_nano,
                            "end_ns": span.end_time_unix_nano,
                            "status": Status.StatusCode.Name(span.status.code),
                            "attributes": attributes(span.attributes),
                        }
                    )
        with open(OUT, "a") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
