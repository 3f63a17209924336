"""What the suite needs around the client: a chime (CHIME_TEST_URL, started by
clients/test.sh), biz types made through the admin API, a real receiver and a proxy that
breaks a connection."""

import http.client
import http.server
import json
import os
import queue
import secrets
import socket
import threading
import urllib.request

URL = os.environ.get("CHIME_TEST_URL", "")
ADMIN_TOKEN = os.environ.get("CHIME_TEST_ADMIN_TOKEN", "")
RUN = secrets.token_hex(3)


def require_chime():
    if not URL or not ADMIN_TOKEN:
        raise RuntimeError("CHIME_TEST_URL and CHIME_TEST_ADMIN_TOKEN are not set: run the suite with clients/test.sh python")


def admin(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(URL + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read() or b"null")


class Biz:
    """A fresh biz type with its signing secret and an API token."""

    def __init__(self, purpose, **settings):
        require_chime()
        self.name = f"py-{RUN}-{purpose}"
        created = admin("POST", "/api/v1/admin/biz-types", {"name": self.name, **settings})
        self.secret = created["signing_secret"]
        self.token = admin("POST", f"/api/v1/admin/biz-types/{self.name}/tokens")["token"]


class Receiver:
    """A real HTTP receiver: every callback's headers and body go to ``calls``; it answers 200."""

    def __init__(self):
        self.calls = queue.Queue()
        calls = self.calls

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                calls.put(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class DroppingProxy:
    """Forwards to chime; the first ``POST /api/v1/tasks`` is forwarded and answered by chime,
    then the connection to the client is dropped without an answer, as a network failure
    after the server stored the task would. With ``unavailable=True`` the first create is
    answered 503 instead, as chime answers while its database is unreachable, and not
    forwarded."""

    def __init__(self, target=None, unavailable=False):
        target = (target or URL).split("//", 1)[1]
        self.dropped = 0
        self.forwarded_creates = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if unavailable and self.command == "POST" and self.path == "/api/v1/tasks" and proxy.dropped == 0:
                    proxy.dropped += 1
                    answer = b'{"error": {"code": "unavailable", "message": "the database is unavailable; retry shortly"}}'
                    self.send_response(503)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                conn = http.client.HTTPConnection(target, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body or None, headers=headers)
                answer = conn.getresponse()
                data = answer.read()
                conn.close()
                if self.command == "POST" and self.path == "/api/v1/tasks":
                    proxy.forwarded_creates += 1
                    if proxy.dropped == 0:
                        proxy.dropped += 1
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PATCH = do_DELETE = _forward

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
