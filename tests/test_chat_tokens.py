"""admit counts prompt tokens on every request with a cheaper path than generate's: both must agree."""

from __future__ import annotations

from transformers import AutoTokenizer

from pipeline.engines.chat_engine import chat_prompt_ids, chat_prompt_len

CASES = [
    [{"role": "user", "content": "Hello there"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "Summarise: 결제 내역을 보여 주세요 <PERSON_1>님"}],
    [{"role": "user", "content": "a" * 3000}, {"role": "assistant", "content": "ok\n\n  spaced  "},
     {"role": "user", "content": "<|im_start|> literal markers and émojis 🚀"}],
    [{"role": "user", "content": ""}],
]


def test_prompt_length_equals_the_chat_template_ids(prepared_model):
    tok = AutoTokenizer.from_pretrained(str(prepared_model))
    for messages in CASES:
        assert chat_prompt_len(tok, messages) == len(chat_prompt_ids(tok, messages)), messages
