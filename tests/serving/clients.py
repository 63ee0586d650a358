"""OpenAI-API clients for the serving tests: completions and chat, streamed or not, some
clients leaving mid-stream; every request bounded in time."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import httpx

REQUEST_TIMEOUT_S = 240


@dataclasses.dataclass
class Request:
    prompt: str
    api: str = "completions"  # or "chat"
    stream: bool = False
    max_tokens: int = 16
    leave_after_chunks: int | None = None  # a streaming client that disconnects
    abort_after_s: float | None = None  # a client that gives up waiting


@dataclasses.dataclass
class Result:
    status: int
    text: str | None  # None: the client left before the end, or an error
    error: str | None = None


def request_body(model: str, request: Request) -> tuple[str, dict[str, Any]]:
    common = {
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": request.stream,
    }
    if request.api == "chat":
        return "/v1/chat/completions", {
            **common,
            "messages": [{"role": "user", "content": request.prompt}],
        }
    return "/v1/completions", {**common, "prompt": request.prompt}


def choice_text(choice: dict[str, Any], api: str, streamed: bool) -> str:
    if api == "completions":
        return choice.get("text") or ""
    message = choice.get("delta" if streamed else "message") or {}
    return message.get("content") or ""


async def send(client: httpx.AsyncClient, model: str, request: Request) -> Result:
    path, body = request_body(model, request)
    if not request.stream:
        try:
            response = await asyncio.wait_for(client.post(path, json=body), request.abort_after_s)
        except asyncio.TimeoutError:
            return Result(200, None)
        if response.status_code != 200:
            return Result(response.status_code, None, response.text)
        return Result(200, choice_text(response.json()["choices"][0], request.api, False))
    pieces: list[str] = []
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return Result(response.status_code, None, response.text)
        chunks = 0
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunks += 1
            if request.leave_after_chunks is not None and chunks >= request.leave_after_chunks:
                return Result(200, None)
            event = json.loads(line[len("data: ") :])
            if "error" in event:
                return Result(int(event["error"].get("code") or 500), None, str(event["error"]))
            for choice in event["choices"]:
                pieces.append(choice_text(choice, request.api, True))
    return Result(200, "".join(pieces))


async def send_all(url: str, model: str, requests: list[Request], concurrency: int) -> list[Result]:
    limits = httpx.Limits(max_connections=concurrency)
    timeout = httpx.Timeout(REQUEST_TIMEOUT_S)
    semaphore = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def bounded(request: Request) -> Result:
            async with semaphore:
                return await send(client, model, request)

        return await asyncio.gather(*(bounded(r) for r in requests))


def run_all(url: str, model: str, requests: list[Request], concurrency: int) -> list[Result]:
    return asyncio.run(send_all(url, model, requests, concurrency))
