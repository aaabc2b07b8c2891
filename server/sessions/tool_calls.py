"""One round of tool calls of a turn: each call run (after the page's approval where the tool asks
for one), its result capped and recorded as a ``tool`` message paired with the call by id.

Frames, per call in the order the model asked: ``tool_call`` (the page shows it running) and then
``tool_result`` with the text the model will see (already capped at ``max_tool_result_chars``, the
cut marked in the text), its size in tokens, its server and whether it is an error. Images a tool
returned ride on the result message (counted and sent in the current turn only).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from server.history.messages import ChatMessage, ToolCall
from server.history.trim import cap_tool_result
from server.protocol import server_frame
from server.providers.base import ToolSpec
from server.sessions.approvals import Approvals
from server.sessions.runtime import Runtime
from server.tools.results import ToolOutput, tool_error

DENIED = ("the user denied this call (the tool asks for approval before each call); do not call it "
          "again for this request unless the user asks")
_CUT = re.compile(r"\[\.\.\. (\d+) characters truncated \.\.\.\]")

Emit = Callable[..., None]


def cut_chars(capped: str, original: str) -> int:
    """Characters ``cap_tool_result`` left out of ``original`` (0 when it kept it whole)."""
    if capped == original:
        return 0
    marks = _CUT.findall(capped)
    return int(marks[-1]) if marks else 0


class ToolRound:
    def __init__(self, rt: Runtime, turn_id: str, emit: Emit, offered: Sequence[ToolSpec],
                 approvals: Approvals) -> None:
        self.rt = rt
        self.turn_id = turn_id
        self.emit = emit
        self.offered = offered
        self.approvals = approvals

    async def run(self, calls: Sequence[ToolCall]) -> list[ChatMessage]:
        return [await self.run_one(call) for call in calls]

    async def run_one(self, call: ToolCall) -> ChatMessage:
        tool = self.rt.toolbox.resolve(call.name, self.offered)
        server = {"server": tool.server} if tool is not None else {}
        self.emit("tool_call", turn_id=self.turn_id, id=call.id, name=call.name, args=call.arguments,
                  **server)
        if tool is not None and tool.approve == "always" and not await self.approved(call, tool.server):
            return self.record(call, server, tool_error(DENIED))
        output = await self.rt.toolbox.run(call.name, call.arguments, self.offered)
        return self.record(call, server, output)

    async def approved(self, call: ToolCall, server: str) -> bool:
        """Ask the page; the turn waits (nothing else does) until the answer or the timeout."""
        frame = server_frame("tool_approval", turn_id=self.turn_id, id=call.id, name=call.name,
                             server=server, args=call.arguments)
        self.emit("tool_approval", **{k: v for k, v in frame.items() if k != "type"})
        allow = await self.approvals.ask(frame, self.rt.options.tool_approval_timeout_seconds)
        self.emit("tool_decided", turn_id=self.turn_id, id=call.id, allow=allow)
        return allow

    def record(self, call: ToolCall, server: dict[str, str], output: ToolOutput) -> ChatMessage:
        text = cap_tool_result(output.text, self.rt.options.max_tool_result_chars)
        message = ChatMessage("tool", text, tool_call_id=call.id, name=call.name,
                              images=list(output.images) or None, turn_id=self.turn_id)
        self.emit("tool_result", turn_id=self.turn_id, id=call.id, name=call.name, output=text,
                  is_error=output.is_error, tokens=message.text_tokens,
                  truncated_chars=cut_chars(text, output.text), **server)
        return message
