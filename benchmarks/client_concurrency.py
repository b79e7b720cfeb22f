"""Requests per second one client process completes with hundreds of requests in flight.

A local server (uvicorn, like vLLM's) answers every POST after a fixed latency, standing
in for a GPU server whose requests each take a while. Same run, same requests: httpx with
its default connection pool (httpcore) against the SDK's transport (`pooled_transport`,
httpx over aiohttp's pool). With a perfect client, ``in_flight / latency`` requests/s.

    python benchmarks/client_concurrency.py --out benchmarks/results/client-concurrency-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import time
from pathlib import Path

import httpx

from minipic_client.client import pooled_transport
from minipic_server.launch import free_port


def serve(port: int, latency_s: float) -> None:
    import uvicorn

    body = b'{"choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":128}}'

    async def app(scope, receive, send):  # a bare ASGI app: the server must not be the bottleneck
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        await asyncio.sleep(latency_s)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error")


async def requests_per_s(url: str, transport: httpx.AsyncBaseTransport | None, in_flight: int, n: int) -> float:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, transport=transport, limits=limits, timeout=120) as http:
        gate = asyncio.Semaphore(in_flight)
        body = {"model": "m", "prompt": list(range(128)), "max_tokens": 1}

        async def one() -> None:
            async with gate:
                response = await http.post("/v1/completions", json=body)
                response.raise_for_status()
                response.json()

        await asyncio.gather(*(one() for _ in range(in_flight)))  # open the connections
        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.latency_ms / 1e3), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.post(url + "/", timeout=2)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    rows = []
    try:
        for in_flight in args.in_flight:
            row = {"in_flight": in_flight, "ideal_requests_per_s": in_flight / (args.latency_ms / 1e3)}
            row["httpx_default_pool"] = asyncio.run(requests_per_s(url, None, in_flight, args.requests))
            row["sdk_pooled_transport"] = asyncio.run(requests_per_s(url, pooled_transport(), in_flight, args.requests))
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
    if args.out:
        result = {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(), "cpus": multiprocessing.cpu_count(),
                  "python": platform.python_version(), "httpx": httpx.__version__,
                  "latency_ms": args.latency_ms, "requests": args.requests, "rows": rows}  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
