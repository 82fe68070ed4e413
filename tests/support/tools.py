"""Two small function tools for the tool tests (tests/test_tools.py, tests/test_tools_stack.py)."""

from __future__ import annotations

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}
EMAIL = {"type": "function", "function": {
    "name": "send_email", "description": "Send an email",
    "parameters": {"type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
                   "required": ["to", "body"]}}}
