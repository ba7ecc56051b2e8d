"""A TCP proxy in front of a real store (MinIO) that can fail it on cue: each HTTP
request is passed, held until `release()`, or the connection is cut, as
`rule(method, path, headers)` says. It
lets a test stop the store at an exact point of a fetch (after a snapshot's head, say)
without touching the node. HTTP/1.1 requests with Content-Length bodies only (what the
node's S3 client sends); responses are relayed as they come."""

import socket
import threading


class FaultProxy:
    def __init__(self, upstream_port, rule=None):
        self.upstream = ("127.0.0.1", upstream_port)
        self.rule = rule or (lambda method, path, headers: "pass")
        self.seen = []  # (method, path, action) of every request, in order
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.endpoint = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = False
        self.released = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self):
        """Let held requests through (and every later one the rule holds)."""
        self.released.set()

    def close(self):
        self.closed = True
        self.sock.close()

    def requests(self, action=None):
        with self.lock:
            return [(m, p) for m, p, a in self.seen if action is None or a == action]

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _serve(self, c):
        try:
            u = socket.create_connection(self.upstream)
        except OSError:
            c.close()
            return
        threading.Thread(target=self._pump, args=(u, c), daemon=True).start()
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = c.recv(1 << 16)
                    if not data:
                        return
                    buf += data
                head, buf = buf.split(b"\r\n\r\n", 1)
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:] if ":" in l)}
                n = int(headers.get("content-length", "0"))
                while len(buf) < n:
                    data = c.recv(1 << 16)
                    if not data:
                        return
                    buf += data
                body, buf = buf[:n], buf[n:]
                action = self.rule(method, path, headers)
                with self.lock:
                    self.seen.append((method, path, action))
                if action == "cut":
                    return
                if action == "hold":
                    self.released.wait()
                u.sendall(head + b"\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            for s in (c, u):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
