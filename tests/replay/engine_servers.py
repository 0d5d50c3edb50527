"""Servers for the engine replay tests: a real `transformers serve` on the tiny target, and a fault-injecting one.

The fault server answers as an OpenAI-compatible engine would, except for the fault its URL path names:
/ok, /500, /malformed, /hang, /wrong-model, /no-seed (422 naming a seed), /429-once (a 429 with Retry-After: 1, then an answer), /429-always.
Every request it gets is recorded (path and headers) so a test can see what was sent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from helpers import free_port


@contextmanager
def transformers_serve(model_path: Path, ready_s: float = 180) -> Iterator[str]:
    """`transformers serve MODEL --host 127.0.0.1 --port P` on CPU; yields its /v1 URL once /health answers."""
    port = free_port()
    cli = Path(sys.executable).with_name("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    server = subprocess.Popen([str(cli), "serve", str(model_path), "--host", "127.0.0.1", "--port", str(port),
                               "--device", "cpu", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + ready_s
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None:
                raise RuntimeError("transformers serve exited: " + server.stderr.read().decode()[-2000:])
            if time.monotonic() > deadline:
                raise RuntimeError("transformers serve did not answer /health in time")
            time.sleep(0.25)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


class FaultServer:
    """An OpenAI-compatible answerer whose URL path picks its fault; `text` is what an answer holds."""

    def __init__(self, text: str = "a fixed answer") -> None:
        self.text = text
        self.seen: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        self.once_429: set[str] = set()
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except BrokenPipeError:  # the client gave up waiting (the hang fault)
                    pass

            def do_GET(self) -> None:
                outer.seen.append((self.path, dict(self.headers), {}))
                self._send(200, json.dumps({"object": "list", "data": [{"id": "served-x"}]}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                outer.seen.append((self.path, dict(self.headers), body))
                fault = self.path.split("/")[1]
                if fault == "500":
                    return self._send(500, b'{"error": {"message": "CUDA error: device-side assert\\u0007"}}')
                if fault == "malformed":
                    return self._send(200, b'{"choices": [{"text": "cut sho')
                if fault == "hang":
                    outer.release.wait(10)
                    return self._send(200, b"{}")
                key = fault + json.dumps(body.get("prompt"))
                if fault == "429-always" or (fault == "429-once" and key not in outer.once_429):
                    outer.once_429.add(key)
                    return self._send(429, b'{"error": {"message": "slow down"}}',
                                      {"Retry-After": "0" if fault == "429-always" else "1"})
                if fault == "no-seed" and "seed" in body:
                    return self._send(422, b'{"detail": "Unexpected fields in the request: {\'seed\'}"}')
                if "prompt_logprobs" in body:
                    return self._send(422, b'{"detail": "Unexpected fields in the request: {\'prompt_logprobs\'}"}')
                model = "someone-else" if fault == "wrong-model" else body.get("model")
                choice = ({"text": outer.text} if "prompt" in body else
                          {"message": {"role": "assistant", "content": outer.text}})
                answer = {"id": "x", "object": "text_completion", "model": model, "system_fingerprint": "fp-test",
                          "choices": [{"index": 0, "finish_reason": "stop", **choice}],
                          "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
                self._send(200, json.dumps(answer).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> FaultServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class LogprobServer:
    """vLLM's completions endpoint as far as replay uses it, computed by the real tiny target in this process:
    token-id prompts, greedy generation, and `prompt_logprobs` ({"id": {"logprob", "rank", "decoded_token"}} per
    position, None for the first) listing the top k and the prompt's own token with its rank."""

    def __init__(self, model: Any, tokenizer: Any, name: str) -> None:
        import torch

        outer = self
        self.seen: list[dict[str, Any]] = []

        def prompt_logprobs(ids: list[int], k: int) -> list[Any]:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([ids])).logits[0].float().log_softmax(-1)
            rows: list[Any] = [None]
            for i in range(1, len(ids)):
                lp = logits[i - 1]
                top = lp.topk(k)
                row = {str(int(t)): {"logprob": float(v), "rank": r + 1, "decoded_token": tokenizer.decode([int(t)])}
                       for r, (v, t) in enumerate(zip(top.values.tolist(), top.indices.tolist(), strict=True))}
                token = ids[i]
                row[str(token)] = {"logprob": float(lp[token]), "rank": int((lp > lp[token]).sum()) + 1,
                                   "decoded_token": tokenizer.decode([token])}
                rows.append(row)
            return rows

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                outer.seen.append(body)
                ids = body["prompt"]
                choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
                if body.get("prompt_logprobs"):
                    choice.update(text="", prompt_logprobs=prompt_logprobs(ids, int(body["prompt_logprobs"])))
                else:
                    with torch.inference_mode():
                        out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                             dtype=torch.long), max_new_tokens=body["max_tokens"], do_sample=False,
                                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
                    new = out[0, len(ids):].tolist()
                    if tokenizer.eos_token_id in new:
                        new = new[: new.index(tokenizer.eos_token_id)]
                        choice["finish_reason"] = "stop"
                    choice["text"] = tokenizer.decode(new, skip_special_tokens=True)
                answer = json.dumps({"id": "cmpl-1", "object": "text_completion", "model": name,
                                     "system_fingerprint": "vllm-shaped", "choices": [choice]}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LogprobServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class RawServer:
    """A TCP server that answers each request with the bytes its path's script writes, as a broken or hostile
    engine might: one byte at a time (in the headers, the body or chunks), a connection cut mid-answer, a redirect
    carrying an answer, a JSON nested past any parser's stack. Scripts: slow-headers, slow-body, slow-chunked,
    cut, cut-chunked, redirect, nested. A slow script stops after `trickle_s` seconds or when the client goes."""

    def __init__(self, step_s: float = 0.4, trickle_s: float = 8.0) -> None:
        import socket

        self.step_s, self.trickle_s = step_s, trickle_s
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_request(self, conn: Any) -> str:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head.split(b" ")[1].decode().split("/")[1]

    def _trickle(self, conn: Any, piece: bytes) -> None:
        ends = time.monotonic() + self.trickle_s
        while time.monotonic() < ends and not self.stop.is_set():
            conn.sendall(piece)
            time.sleep(self.step_s)

    def _serve(self, conn: Any) -> None:
        answer = json.dumps({"object": "list", "data": [{"id": "served-x"}], "model": "served-x",
                             "choices": [{"index": 0, "text": "a redirected answer", "finish_reason": "stop"}]}
                            ).encode()
        try:
            script = self._read_request(conn)
            if script == "slow-headers":
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                self._trickle(conn, b"X")
            elif script == "slow-body":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n")
                self._trickle(conn, b" ")
            elif script == "slow-chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                self._trickle(conn, b"1\r\n \r\n")
            elif script == "cut":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                             + answer[:30])
            elif script == "cut-chunked":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                             + b"%x\r\n" % len(answer[:30]) + answer[:30] + b"\r\n")
            elif script == "redirect":
                conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.example/v1/completions\r\n"
                             b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer)
            elif script == "nested":
                body = b"[" * 200_000 + b"]" * 200_000
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                             % len(body) + body)
        except OSError:  # the client gave up: what a slow script waits for
            pass
        finally:
            conn.close()

    def __enter__(self) -> RawServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.sock.close()


# llama-server's sampling defaults (common/common.h), which it applies to any field a request leaves out.
LLAMA_DEFAULTS = {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "typical_p": 1.0,
                  "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "mirostat": 0,
                  "xtc_probability": 0.0, "dry_multiplier": 0.0, "top_n_sigma": -1.0, "seed": 4294967295}


class LlamaServer:
    """llama.cpp's llama-server as far as replay sees it: /v1/completions and /v1/chat/completions answering
    `text` with the generation settings it applied (`generation_settings`, its defaults for what the request leaves
    out), the generated token ids (`tokens`, with `return_tokens`), `usage` and `timings`.

    `tokenize` turns text into the ids it reports. The first part of the URL path picks a behaviour: /ok,
    /stubborn (applies its own top_k and min_p whatever is asked), /count-N (reports N generated tokens and no
    ids), /long (ignores max_tokens: answers `long_text`, its words counted as tokens), /logprobs-BAD
    (prompt_logprobs whose every value is BAD: nan, inf, huge, positive, rank0, rank-huge)."""

    def __init__(self, text: str, name: str, tokenize: Any = None, long_text: str = "") -> None:
        outer = self
        self.seen: list[dict[str, Any]] = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, raw: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:
                self._send(json.dumps({"object": "list", "data": [{"id": name}]}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                outer.seen.append(body)
                mode = self.path.split("/")[1]
                if body.get("prompt_logprobs") and mode.startswith("logprobs-"):
                    return self._send(_bad_logprobs(body["prompt"], mode.removeprefix("logprobs-")))
                text = long_text if mode == "long" else outer.text
                applied = {**LLAMA_DEFAULTS, **{k: v for k, v in body.items() if k in LLAMA_DEFAULTS},
                           "n_predict": body.get("max_tokens", -1)}
                if mode == "stubborn":
                    applied.update(top_k=40, min_p=0.05)
                ids = tokenize(text) if tokenize is not None and mode in ("ok", "stubborn") else None
                count = int(mode.removeprefix("count-")) if mode.startswith("count-") else (
                    len(ids) if ids is not None else len(text.split()))
                choice = ({"text": text} if "prompt" in body else {"message": {"role": "assistant", "content": text}})
                verbose: dict[str, Any] = {"generation_settings": applied, "tokens_predicted": count}
                if ids is not None and body.get("return_tokens"):
                    verbose["tokens"] = ids
                answer = {"id": "chatcmpl-1", "object": "text_completion", "model": name,
                          "system_fingerprint": "b6000-llama", "choices": [{"index": 0, "finish_reason": "stop",
                                                                            **choice}],
                          "usage": {"prompt_tokens": 5, "completion_tokens": count, "total_tokens": 5 + count},
                          "timings": {"prompt_n": 5, "predicted_n": count}, "__verbose": verbose}
                self._send(json.dumps(answer).encode())

        self.text = text
        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LlamaServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _bad_logprobs(ids: list[int], bad: str) -> bytes:
    """A vLLM-shaped prompt_logprobs answer in which every listed value is one no model gives."""
    value = {"nan": "NaN", "inf": "Infinity", "huge": "1e400", "positive": "0.5"}.get(bad, "-0.1")
    rank = {"rank0": "0", "rank-huge": "-1000000000000000000000000000"}.get(bad, "1")
    rows = ["null"] + [f'{{"{t}": {{"logprob": {value}, "rank": {rank}}}}}' for t in ids[1:]]
    return ('{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "", '
            '"finish_reason": "length", "prompt_logprobs": [' + ", ".join(rows) + "]}]}").encode()
