"""A real S3-compatible server (moto) on loopback, for cloud paths.

The server is a child process bound to 127.0.0.1 on a free port. It is stopped at teardown, and the
kernel stops it too if the test process dies first (PR_SET_PDEATHSIG).
"""

import ctypes
import signal
import socket
import subprocess
import sys
import uuid

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self):
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                    "AWS_ENDPOINT_URL": self.endpoint, "FSSPEC_S3_ENDPOINT_URL": self.endpoint}
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     preexec_fn=_die_with_parent)
        # werkzeug announces the bound address once it accepts connections: wait for that line.
        seen = []
        for line in self.proc.stderr:
            seen.append(line)
            if "Running on" in line:
                break
        else:
            raise RuntimeError("moto server did not start:\n" + "".join(seen))
        self._drain = subprocess.Popen(["cat"], stdin=self.proc.stderr, stdout=subprocess.DEVNULL,
                                       preexec_fn=_die_with_parent)  # keep its log pipe from filling up

    def bucket(self) -> str:
        """A fresh bucket; returns its s3:// URL."""
        import s3fs

        name = f"b-{uuid.uuid4().hex[:12]}"
        s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, key="testing", secret="testing",
                          skip_instance_cache=True).mkdir(name)
        return f"s3://{name}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self._drain.wait(timeout=30)
