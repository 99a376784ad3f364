#!/usr/bin/env python3
"""A scripted model upstream for timing agent turns (scripts/bench-agent-turn); never a real
model. Speaks the Anthropic Messages API (POST /v1/messages, SSE or JSON) and the OpenAI
Responses API (POST /v1/responses, SSE). A prompt containing "write the file" gets one tool
call that writes /workspace/hello.txt (Claude Code's Write / codex's exec_command); a tool
result gets a final message. Each request's arrival time goes to the log file as `T=<unix>`.

usage: model_upstream.py PORT LOGFILE
"""
import http.server
import json
import sys
import time

PORT, LOG = int(sys.argv[1]), sys.argv[2]


def log(path):
    with open(LOG, "a") as f:
        f.write(f"T={time.time():.4f} {path}\n")


def read_body(handler):
    if handler.headers.get("transfer-encoding", "").lower() == "chunked":
        raw = b""
        while True:
            size = int(handler.rfile.readline().strip(), 16)
            if size == 0:
                handler.rfile.readline()
                return raw
            raw += handler.rfile.read(size)
            handler.rfile.readline()
    return handler.rfile.read(int(handler.headers.get("content-length", "0")))


def sse(events):
    return b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)


def messages(body):
    """Anthropic Messages: the blocks and stop reason for this conversation."""
    msgs = body.get("messages", [])
    last = next((m for m in reversed(msgs) if m.get("role") == "user"), {})
    content = last.get("content")
    results = isinstance(content, list) and any(
        isinstance(c, dict) and c.get("type") == "tool_result" for c in content)
    tools = [t.get("name") for t in body.get("tools", [])]
    write = next((t for t in tools if t and t.endswith("Write")), None)
    text = json.dumps(content)
    if write and not results and "write the file" in text:
        return [{"type": "tool_use", "id": f"toolu_{time.time_ns()}", "name": write,
                 "input": {"file_path": "/workspace/hello.txt", "content": "hi\n"}}], "tool_use"
    return [{"type": "text", "text": "done"}], "end_turn"


def anthropic_events(blocks, stop):
    mid = f"msg_{time.time_ns()}"
    ev = [("message_start", {"type": "message_start", "message": {
        "id": mid, "type": "message", "role": "assistant", "model": "scripted", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1}}})]
    for i, b in enumerate(blocks):
        if b["type"] == "text":
            ev.append(("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": {"type": "text", "text": ""}}))
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": i,
                                               "delta": {"type": "text_delta", "text": b["text"]}}))
        else:
            ev.append(("content_block_start", {"type": "content_block_start", "index": i,
                                               "content_block": dict(b, input={})}))
            ev.append(("content_block_delta", {"type": "content_block_delta", "index": i, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(b["input"])}}))
        ev.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    ev.append(("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": stop, "stop_sequence": None},
                                 "usage": {"output_tokens": 1}}))
    ev.append(("message_stop", {"type": "message_stop"}))
    return ev


def responses(body):
    """OpenAI Responses: one output item for this conversation."""
    items = body.get("input", [])
    last_user = max((i for i, it in enumerate(items)
                     if it.get("type") == "message" and it.get("role") == "user"), default=0)
    after = items[last_user:]
    if any(it.get("type") == "function_call_output" for it in after):
        return {"type": "message", "id": f"msg_{time.time_ns()}", "role": "assistant",
                "content": [{"type": "output_text", "text": "done"}]}
    if "write the file" in json.dumps(items[last_user] if items else {}):
        return {"type": "function_call", "id": f"fc_{time.time_ns()}", "call_id": "call_write",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": "echo hi > /workspace/hello.txt"})}
    return {"type": "message", "id": f"msg_{time.time_ns()}", "role": "assistant",
            "content": [{"type": "output_text", "text": "done"}]}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def send(self, status, ctype, data):
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        log(self.path)
        body = json.loads(read_body(self) or b"{}")
        if self.path.startswith("/v1/messages/count_tokens"):
            return self.send(200, "application/json", b'{"input_tokens": 1}')
        if self.path.startswith("/v1/messages"):
            blocks, stop = messages(body)
            if body.get("stream"):
                return self.send(200, "text/event-stream", sse(anthropic_events(blocks, stop)))
            return self.send(200, "application/json", json.dumps({
                "id": f"msg_{time.time_ns()}", "type": "message", "role": "assistant",
                "model": "scripted", "content": blocks, "stop_reason": stop,
                "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}}).encode())
        if self.path.startswith("/v1/responses"):
            rid = f"resp_{time.time_ns()}"
            return self.send(200, "text/event-stream", sse([
                ("response.created", {"type": "response.created", "response": {"id": rid}}),
                ("response.output_item.done", {"type": "response.output_item.done",
                                               "output_index": 0, "item": responses(body)}),
                ("response.completed", {"type": "response.completed", "response": {
                    "id": rid, "usage": {"input_tokens": 1, "input_tokens_details": None,
                                         "output_tokens": 1, "output_tokens_details": None,
                                         "total_tokens": 2}}})]))
        self.send(404, "application/json", b"{}")

    def log_message(self, *args):
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
