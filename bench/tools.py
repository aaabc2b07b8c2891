"""What a tool round trip through meterchat costs over calling the MCP server directly.

    python bench/tools.py [--quick] [--calls N]

The MCP server is the real ``mcp-server-time`` (stdio). Three figures, each the median of N:

- direct: ``call_tool("get_current_time")`` on the official SDK's ``Client``, the baseline;
- in the loop: from the ``tool_call`` frame to its ``tool_result`` as a WebSocket client of a
  meterchat server sees them (the toolbox, the result's conversion and cap, the frames);
- turn: a whole turn whose model (the fake OpenAI provider, a real HTTP server on 127.0.0.1) asks
  for the call and then answers, against a turn that asks for nothing (the extra provider round,
  the tool message written to the store, the meter before each send).

Each is printed with its ratio to the same-run baseline. Timings are noisy on a shared machine:
compare ratios, not milliseconds, and run it more than once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcp.client import Client  # noqa: E402
from mcp.client.stdio import StdioServerParameters  # noqa: E402

from tests.fakes.base import Call, Reply, running  # noqa: E402
from tests.fakes.openai_fake import FakeOpenAI  # noqa: E402
from tests.support import client, serve, settings_for  # noqa: E402

ARGS = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
TOKYO = {"timezone": "Asia/Tokyo"}


async def direct(calls: int) -> list[float]:
    params = StdioServerParameters(command=sys.executable, args=ARGS)
    times = []
    async with Client(params, cache=None) as mcp:
        await mcp.list_tools()
        for _ in range(calls):
            start = time.perf_counter()
            await mcp.call_tool("get_current_time", TOKYO)
            times.append(time.perf_counter() - start)
    return times


def answer(body: dict[str, Any]) -> Reply:
    """The fake model: ask for the time unless the last message is the tool's answer or says plain
    (each call its own id, as a provider gives them)."""
    last = body["messages"][-1]
    if last["role"] == "tool" or "plain" in str(last.get("content")):
        return Reply(text=["It is evening in Tokyo."])
    return Reply(tool_calls=[Call("time__get_current_time", TOKYO, f"call_{len(body['messages'])}")])


async def through_meterchat(address: str, calls: int) -> tuple[list[float], list[float], list[float]]:
    in_loop, with_tool, plain = [], [], []
    async with client(address) as c:
        await c.hello()
        for n in range(calls):
            start = time.perf_counter()
            await c.send("message", id=f"t{n}", content="what time is it in Tokyo?")
            await c.until("tool_call")
            called = time.perf_counter()
            await c.until("tool_result")
            in_loop.append(time.perf_counter() - called)
            await c.until("done")
            with_tool.append(time.perf_counter() - start)
            start = time.perf_counter()
            await c.say("plain answer please")
            plain.append(time.perf_counter() - start)
    return in_loop, with_tool, plain


def row(name: str, times: list[float], baseline: float) -> str:
    median = statistics.median(times)
    return f"{name:<28} {median * 1000:9.2f} ms   x{median / baseline:6.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 calls: a smoke run")
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    calls = 5 if args.quick else args.calls
    baseline_times = anyio.run(direct, calls)
    with running(FakeOpenAI(), "/v1") as fake, tempfile.TemporaryDirectory() as tmp:
        fake.default = answer
        settings = settings_for(Path(tmp), {
            "providers": {"p": {"kind": "openai", "base_url": fake.base_url, "model": "m",
                                "discover_window": False}},
            "mcp_servers": {"time": {"command": sys.executable, "args": ARGS}}})
        with serve(settings) as address:
            in_loop, with_tool, plain = anyio.run(through_meterchat, address, calls)
    baseline = statistics.median(baseline_times)
    print(f"tool round trip, median of {calls} (machine shared with other jobs: compare ratios)")
    print(row("direct MCP call (baseline)", baseline_times, baseline))
    print(row("tool_call -> tool_result", in_loop, baseline))
    print(row("turn with one tool call", with_tool, baseline))
    print(row("turn without tools", plain, baseline))
    added = statistics.median(with_tool) - statistics.median(plain)
    print(f"{'a tool call adds to a turn':<28} {added * 1000:9.2f} ms   x{added / baseline:6.2f}")


if __name__ == "__main__":
    main()
