"""A chat as the model reads it: the messages through the model's chat template.

The assistant's earlier tool calls and a tool message's call id go to the template as OpenAI sends
them; a model without a template (the tiny model) gets 'role: content' lines.
"""

from __future__ import annotations

from typing import Any

from tracer.serve.protocol import Message, RequestError


def render_chat(tokenizer: Any, messages: list[Message], add_generation_prompt: bool = True) -> str:
    """The conversation through the model's chat template, ready for the assistant's turn (unless
    add_generation_prompt is False)."""
    conversation = [template_message(m) for m in messages]
    if not getattr(tokenizer, "chat_template", None):
        return "".join(f"{m['role']}: {m['content']}\n" for m in conversation) + (
            "assistant:" if add_generation_prompt else ""
        )
    try:
        return tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as e:  # the template itself refuses (e.g. roles out of order)
        raise RequestError(f"the chat template refused these messages: {e}", "messages") from None


def template_message(message: Message) -> dict:
    """A message as chat templates read it (an assistant's tool calls, a tool's call id kept)."""
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role, "content": message.text()}
    if message.tool_calls is not None:
        out["tool_calls"] = message.tool_calls
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out
